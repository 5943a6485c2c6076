package limits

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"time"
)

// Reading a state stream back (the format is described in state.go): a
// decoder that checks every bound before it trusts a length, stages the
// counters per shard, then merges them into the store.

// LoadStats says what ReadState did with a stream's counters.
type LoadStats struct {
	SavedAt time.Time // when the state was saved; zero when there was none
	Loaded  int       // counters restored
	Expired int       // counters with nothing left at load time, dropped
	Kept    int       // counters the store already held, kept as they were
	Dropped int       // counters past the store's MaxKeys, dropped
}

// ReadState loads the counters written by WriteState into the store, at
// now: a counter with nothing left at now (every slot of its window has
// left it, its bucket is full again) is dropped; one the store already
// holds is kept as the store has it; none is added past MaxKeys. A
// restored counter is a new one for Settle (a fresh generation) and keeps
// the algorithm and window it was made under, so a rule changed since
// restarts its counting at its first decision, as after a reload.
//
// Nothing is loaded unless the whole stream is intact: a truncated,
// corrupted, out-of-bounds or other-version stream returns an error
// wrapping ErrDamagedState, any other read error is returned as it is.
func (m *Memory) ReadState(r io.Reader, now time.Time) (LoadStats, error) {
	d := stateDecoder{r: bufio.NewReaderSize(r, 64<<10), h: sha256.New(), now: now.UnixNano(), room: m.perShardCap}
	staged, st, err := d.decode(m)
	if err != nil {
		return LoadStats{}, err
	}
	m.merge(staged, &st)
	return st, nil
}

// stateDecoder reads a stream, hashing every byte before the checksum.
type stateDecoder struct {
	r     *bufio.Reader
	h     hash.Hash
	one   [1]byte
	buf   []byte
	rules []string
	now   int64
	room  int // counters staged per shard at most
}

type stagedEntry struct {
	k stateKey
	e *entry
}

// readErr maps a read error: the stream ending early is damage.
func readErr(err error, what string) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return damaged("truncated in the %s", what)
	}
	return fmt.Errorf("reading state: %w", err)
}

func (d *stateDecoder) full(n int, what string) ([]byte, error) {
	if cap(d.buf) < n {
		d.buf = make([]byte, n)
	}
	b := d.buf[:n]
	if _, err := io.ReadFull(d.r, b); err != nil {
		return nil, readErr(err, what)
	}
	d.h.Write(b)
	return b, nil
}

func (d *stateDecoder) uvarint(what string) (uint64, error) {
	var v uint64
	for i := 0; i < binary.MaxVarintLen64; i++ {
		b, err := d.r.ReadByte()
		if err != nil {
			return 0, readErr(err, what)
		}
		d.one[0] = b
		d.h.Write(d.one[:])
		if i == binary.MaxVarintLen64-1 && b > 1 {
			break
		}
		v |= uint64(b&0x7f) << (7 * i)
		if b < 0x80 {
			return v, nil
		}
	}
	return 0, damaged("bad varint in the %s", what)
}

func (d *stateDecoder) decode(m *Memory) (*[shardCount][]stagedEntry, LoadStats, error) {
	var st LoadStats
	magic, err := d.full(len(stateMagic), "header")
	if err != nil {
		return nil, st, err
	}
	if string(magic) != stateMagic {
		return nil, st, damaged("not a state file")
	}
	v, err := d.uvarint("header")
	if err != nil {
		return nil, st, err
	}
	if v != stateVersion {
		return nil, st, damaged("format version %d, this build reads %d", v, stateVersion)
	}
	saved, err := d.uvarint("header")
	if err != nil {
		return nil, st, err
	}
	if saved >= maxStateTime {
		return nil, st, damaged("saved at %d ns: out of range", saved)
	}
	st.SavedAt = time.Unix(0, int64(saved))

	staged := new([shardCount][]stagedEntry)
	counters := uint64(0)
	for {
		n, err := d.uvarint("records")
		if err != nil {
			return nil, st, err
		}
		if n == 0 {
			break
		}
		if n > maxStateRecord {
			return nil, st, damaged("record %d: %d bytes", counters, n)
		}
		rec, err := d.full(int(n), "records")
		if err != nil {
			return nil, st, err
		}
		if rec[0] == recRule {
			if len(rec) == 1 || len(rec) > 1+maxStateName || len(d.rules) >= maxStateRules {
				return nil, st, damaged("rule record %d: bad name or too many rules", len(d.rules))
			}
			d.rules = append(d.rules, string(rec[1:]))
			continue
		}
		k, e, err := d.counter(rec)
		if err != nil {
			return nil, st, fmt.Errorf("%w (counter record %d)", err, counters)
		}
		counters++
		if e.idle(d.now) {
			st.Expired++
			continue
		}
		i := m.shardOf(k.rule, k.key)
		if len(staged[i]) >= d.room {
			st.Dropped++
			continue
		}
		staged[i] = append(staged[i], stagedEntry{k: k, e: e})
	}
	count, err := d.uvarint("end")
	if err != nil {
		return nil, st, err
	}
	if count != counters {
		return nil, st, damaged("%d counter records, the end says %d", counters, count)
	}
	want := d.h.Sum(nil)
	var got [sha256.Size]byte
	if _, err := io.ReadFull(d.r, got[:]); err != nil {
		return nil, st, readErr(err, "checksum")
	}
	if string(got[:]) != string(want) {
		return nil, st, damaged("checksum mismatch")
	}
	if _, err := d.r.ReadByte(); err != io.EOF {
		if err != nil {
			return nil, st, readErr(err, "end")
		}
		return nil, st, damaged("bytes after the checksum")
	}
	return staged, st, nil
}

// counter decodes one counter record into a detached entry (no
// generation yet), its expired slots dropped at the decoder's now.
func (d *stateDecoder) counter(rec []byte) (stateKey, *entry, error) {
	c := cursor{b: rec[1:]}
	kind := rec[0]
	if kind != recWindow && kind != recBucket && kind != recCalendar {
		return stateKey{}, nil, damaged("unknown record kind %d", kind)
	}
	ri := c.uvarint()
	keyLen := c.uvarint()
	if c.err != nil || ri >= uint64(len(d.rules)) || keyLen > maxStateName {
		return stateKey{}, nil, damaged("bad rule index or key length")
	}
	k := stateKey{rule: d.rules[ri], key: string(c.bytes(int(keyLen)))}
	span := c.uvarint()
	touched := c.uvarint()
	if c.err != nil || span < uint64(time.Microsecond) || span >= maxStateTime || touched > math.MaxUint32 {
		return stateKey{}, nil, damaged("bad window or time")
	}
	e := &entry{w: window{span: int64(span)}, touched: uint32(touched), isBucket: kind == recBucket, isCalendar: kind == recCalendar}
	if e.isCalendar {
		start, end, count := c.uvarint(), c.uvarint(), c.uvarint()
		if c.err != nil || start >= maxStateTime || end >= maxStateTime || start >= end || count > maxStateUnits {
			return stateKey{}, nil, damaged("bad calendar counter")
		}
		e.setCalendar(int64(start), int64(end), int64(count))
	} else if e.isBucket {
		bits := c.bytes(8)
		last, full := c.uvarint(), c.uvarint()
		if c.err != nil {
			return stateKey{}, nil, damaged("short bucket")
		}
		tokens := math.Float64frombits(binary.LittleEndian.Uint64(bits))
		if math.IsNaN(tokens) || math.IsInf(tokens, 0) || last >= maxStateTime || full >= maxStateTime {
			return stateKey{}, nil, damaged("bad bucket")
		}
		e.setBucket(bucket{tokens: tokens, last: int64(last), full: int64(full)})
	} else if err := c.window(&e.w); err != nil {
		return stateKey{}, nil, err
	}
	if c.err != nil || len(c.b) != 0 {
		return stateKey{}, nil, damaged("record of the wrong length")
	}
	if !e.isBucket && !e.isCalendar {
		e.w.expire(d.now)
	}
	return k, e, nil
}

// window decodes a window's slots into w (whose span is set).
func (c *cursor) window(w *window) error {
	gone := c.varint()
	n := c.uvarint()
	// Each slot takes at least two bytes: a record cannot claim more
	// slots than it carries.
	if c.err != nil || gone <= -maxStateTime || gone >= maxStateTime || n < 1 || n > maxSlots+1 || n > uint64(len(c.b))/2 {
		return damaged("bad slot count")
	}
	w.gone = gone
	slots := []slot{{}}
	if n > 1 {
		slots = make([]slot, n)
		w.ring = &slots
	}
	at := int64(0)
	for i := range slots {
		step, units := c.uvarint(), c.uvarint()
		if c.err != nil || (i > 0 && step == 0) || step >= uint64(maxStateTime-at) || units < 1 || units > maxStateUnits {
			return damaged("bad slot")
		}
		at += int64(step)
		slots[i] = slot{at: at, n: int64(units)}
		w.used += int64(units)
	}
	if slots[0].at == 0 {
		return damaged("bad slot")
	}
	if w.ring == nil {
		w.one = slots[0]
	}
	w.size = int32(n)
	return nil
}

// merge adds the staged counters to the store: a key it already holds is
// kept, none past a shard's capacity; each gets a fresh generation.
func (m *Memory) merge(staged *[shardCount][]stagedEntry, st *LoadStats) {
	for i := range staged {
		if len(staged[i]) == 0 {
			continue
		}
		s := &m.shards[i]
		s.mu.Lock()
		for _, x := range staged[i] {
			switch {
			case s.m[x.k] != nil:
				st.Kept++
			case len(s.m) >= m.perShardCap:
				st.Dropped++
			default:
				x.e.gen = s.nextGen()
				s.m[x.k] = x.e
				m.keys.Add(1)
				st.Loaded++
			}
		}
		s.mu.Unlock()
	}
}

// cursor reads varints and bytes from a record; the first problem sticks.
type cursor struct {
	b   []byte
	err error
}

var errShort = damaged("short record")

func (c *cursor) uvarint() uint64 {
	if c.err != nil {
		return 0
	}
	v, n := binary.Uvarint(c.b)
	if n <= 0 {
		c.err = errShort
		return 0
	}
	c.b = c.b[n:]
	return v
}

func (c *cursor) varint() int64 {
	if c.err != nil {
		return 0
	}
	v, n := binary.Varint(c.b)
	if n <= 0 {
		c.err = errShort
		return 0
	}
	c.b = c.b[n:]
	return v
}

func (c *cursor) bytes(n int) []byte {
	if c.err != nil || n > len(c.b) {
		c.err = errShort
		return nil
	}
	b := c.b[:n]
	c.b = c.b[n:]
	return b
}
