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

// The state of a Memory store (SPEC §7.6) is written as a versioned binary
// stream:
//
//	magic    "RLPSTATE"
//	version  uvarint (stateVersion)
//	saved at uvarint, unix ns
//	records  uvarint length (1..maxStateRecord), then that many bytes
//	end      uvarint 0, then uvarint count of counter records
//	checksum SHA-256 of every byte before it (32 bytes), then EOF
//
// A record is a rule name (kind 1: the name's bytes; the n-th rule record
// is rule n, and counter records name their rule by that index) or a
// counter of one (rule, key), written while it is live:
//
//	kind     1 byte: 2 sliding window, 3 token bucket, 4 calendar
//	rule     uvarint index of an earlier rule record
//	key      uvarint length, bytes
//	span     uvarint, ns: the rule's window when the counter was made
//	touched  uvarint, unix s of the last decision (LRU)
//	window:  gone varint (unix ns), slot count uvarint (1..maxSlots+1),
//	         first slot: time uvarint (unix ns), units uvarint;
//	         each next slot: time after the previous uvarint (>= 1), units uvarint
//	bucket:  tokens float64 (IEEE 754 bits, little endian), last and full
//	         uvarint, unix µs
//	calendar: period start and end uvarint (unix s), count uvarint
//
// Every time is the store's own wall-clock reading (time.Time.UnixNano).
// Nothing is applied to the store until the checksum has been verified,
// so a truncated or corrupted stream loads nothing.

const (
	stateMagic   = "RLPSTATE"
	stateVersion = 1

	recRule     = 1
	recWindow   = 2
	recBucket   = 3
	recCalendar = 4

	// maxStateName bounds a rule name and a key in the stream; a counter
	// with a longer one is not saved.
	maxStateName = 4 << 10
	// maxStateRules bounds the distinct rule names of a stream.
	maxStateRules = 4096
	// maxStateRecord bounds one record: a key, 1001 slots of two 10-byte
	// varints and the fixed fields fit with room to spare.
	maxStateRecord = 32 << 10
	// maxStateTime bounds every time and window in the stream (ns; 2116
	// as a unix time), so that a time plus a window never overflows.
	maxStateTime = 1 << 62
	// maxStateUnits bounds a slot's units, so their sum cannot overflow.
	maxStateUnits = 1 << 52
)

// ErrDamagedState reports a state stream that is truncated, corrupted, of
// another format version or out of bounds. Nothing of it was loaded; the
// caller should set the file aside.
var ErrDamagedState = errors.New("limits: damaged state")

func damaged(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrDamagedState}, args...)...)
}

// savedEntry is one live counter as copied out of its shard.
type savedEntry struct {
	rule, key string
	span      int64
	touched   uint32
	isBucket  bool
	isCal     bool
	calStart  int64
	calEnd    int64
	calCount  int64
	b         bucket
	gone      int64
	slots     [2]int // the counter's slots in the snapshot's arena, [from, to)
}

// snapshot is the live counters of one shard, copied under its lock.
type snapshot struct {
	entries []savedEntry
	arena   []slot
}

// copyShard copies the counters of s that hold something at now (ns)
// and that the stream can carry. It holds s's lock only while copying,
// and lets go of it every copyBatch units of work (a counter, a slot), so
// that requests on a shard of many keys wait at most that long; a counter
// is always copied whole. A window's slots that have left it are not
// copied.
func (sn *snapshot) copyShard(s *shard, now int64) {
	sn.entries, sn.arena = sn.entries[:0], sn.arena[:0]
	s.mu.Lock()
	defer s.mu.Unlock()
	work := 0
	// Counters added or dropped while the lock is let go may be seen or
	// not, as the language defines for a map changed during a range.
	for k, e := range s.m {
		if work >= copyBatch {
			s.mu.Unlock()
			work = 0
			s.mu.Lock()
		}
		work++
		if e.idle(now) || !saveable(k, e) {
			continue
		}
		se := savedEntry{rule: k.rule, key: k.key, span: e.w.span, touched: e.touched, isBucket: e.isBucket, gone: e.w.gone}
		if e.isBucket {
			se.b, se.gone = e.bucket(), 0
		}
		if e.isCalendar {
			se.isCal, se.gone = true, 0
			se.calStart, se.calEnd, se.calCount = e.calendar()
		}
		if !e.isBucket && !e.isCalendar {
			from := len(sn.arena)
			for i := 0; i < int(e.w.size); i++ {
				sl := *e.w.at(i)
				if sl.at <= now-e.w.span {
					se.gone = max(se.gone, now-e.w.span) // as expire would
					continue
				}
				sn.arena = append(sn.arena, sl)
			}
			se.slots = [2]int{from, len(sn.arena)}
			work += int(e.w.size)
		}
		sn.entries = append(sn.entries, se)
	}
}

// copyBatch is the work copyShard does per hold of a shard's lock: about
// 80 µs on a small VM (BenchmarkSaveState's store; a whole shard of a
// 1M-key store would hold it some 6 ms).
const copyBatch = 2048

// saveable reports whether the stream can carry e under k: the reader's
// bounds hold (they hold for every counter a running store makes, short
// of a key over 4 KiB, a window over 146 years or a clock before 1970).
func saveable(k stateKey, e *entry) bool {
	if k.rule == "" || len(k.rule) > maxStateName || len(k.key) > maxStateName ||
		e.w.span < int64(time.Microsecond) || e.w.span >= maxStateTime {
		return false
	}
	if e.isBucket {
		b := e.bucket()
		return !math.IsNaN(b.tokens) && !math.IsInf(b.tokens, 0) &&
			inStateRange(b.last) && inStateRange(b.full)
	}
	if e.isCalendar {
		start, end, count := e.calendar()
		return inStateRange(start) && inStateRange(end) && start < end && count >= 0 && count <= maxStateUnits
	}
	if e.w.size > maxSlots+1 || e.w.gone <= -maxStateTime || e.w.gone >= maxStateTime {
		return false
	}
	prev := int64(0)
	for i := 0; i < int(e.w.size); i++ {
		// Slot times are distinct and in order (window.place); the
		// reader refuses a stream where they are not.
		s := e.w.at(i)
		if s.at <= prev || s.at >= maxStateTime || s.n < 1 || s.n > maxStateUnits {
			return false
		}
		prev = s.at
	}
	return true
}

func inStateRange(t int64) bool { return t >= 0 && t < maxStateTime }

// WriteState writes every counter of the store that holds something at
// now to w, in the format described above, and returns how many it wrote.
// The store keeps serving meanwhile: a shard is locked only while its
// counters are copied (a few thousand at a time), and they are encoded
// after. Each counter is saved whole, as it was at one instant; different
// counters at slightly different instants. A counter the format cannot
// carry (a key over 4 KiB, a window over 146 years) is left out.
func (m *Memory) WriteState(w io.Writer, now time.Time) (int, error) {
	ns := now.UnixNano()
	if !inStateRange(ns) {
		return 0, fmt.Errorf("saving state: time %v out of range", now)
	}
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(w, h), 64<<10)
	var hdr []byte
	hdr = append(hdr, stateMagic...)
	hdr = binary.AppendUvarint(hdr, stateVersion)
	hdr = binary.AppendUvarint(hdr, uint64(ns))
	bw.Write(hdr)

	enc := &stateEncoder{w: bw, rules: make(map[string]uint64)}
	var sn snapshot
	for i := range m.shards {
		sn.copyShard(&m.shards[i], ns)
		for j := range sn.entries {
			enc.entry(&sn.entries[j], sn.arena)
		}
	}
	var end []byte
	end = binary.AppendUvarint(end, 0)
	end = binary.AppendUvarint(end, uint64(enc.n))
	bw.Write(end)
	if err := bw.Flush(); err != nil {
		return 0, fmt.Errorf("saving state: %w", err)
	}
	if _, err := w.Write(h.Sum(nil)); err != nil {
		return 0, fmt.Errorf("saving state: %w", err)
	}
	return enc.n, nil
}

type stateEncoder struct {
	w     *bufio.Writer // errors are sticky: checked at Flush
	rules map[string]uint64
	rec   []byte
	l     [binary.MaxVarintLen64]byte
	n     int
}

func (c *stateEncoder) record(rec []byte) {
	c.w.Write(c.l[:binary.PutUvarint(c.l[:], uint64(len(rec)))])
	c.w.Write(rec)
}

func (c *stateEncoder) entry(e *savedEntry, arena []slot) {
	idx, ok := c.rules[e.rule]
	if !ok {
		if len(c.rules) >= maxStateRules {
			return
		}
		idx = uint64(len(c.rules))
		c.rules[e.rule] = idx
		c.record(append(append(c.rec[:0], recRule), e.rule...))
	}
	r := c.rec[:0]
	switch {
	case e.isBucket:
		r = append(r, recBucket)
	case e.isCal:
		r = append(r, recCalendar)
	default:
		r = append(r, recWindow)
	}
	r = binary.AppendUvarint(r, idx)
	r = binary.AppendUvarint(r, uint64(len(e.key)))
	r = append(r, e.key...)
	r = binary.AppendUvarint(r, uint64(e.span))
	r = binary.AppendUvarint(r, uint64(e.touched))
	if e.isCal {
		r = binary.AppendUvarint(r, uint64(e.calStart))
		r = binary.AppendUvarint(r, uint64(e.calEnd))
		r = binary.AppendUvarint(r, uint64(e.calCount))
	} else if e.isBucket {
		r = binary.LittleEndian.AppendUint64(r, math.Float64bits(e.b.tokens))
		r = binary.AppendUvarint(r, uint64(e.b.last))
		r = binary.AppendUvarint(r, uint64(e.b.full))
	} else {
		slots := arena[e.slots[0]:e.slots[1]]
		r = binary.AppendVarint(r, e.gone)
		r = binary.AppendUvarint(r, uint64(len(slots)))
		prev := int64(0)
		for _, s := range slots {
			r = binary.AppendUvarint(r, uint64(s.at-prev))
			r = binary.AppendUvarint(r, uint64(s.n))
			prev = s.at
		}
	}
	c.rec = r
	c.record(r)
	c.n++
}

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
