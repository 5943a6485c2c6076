package limits

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
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
	s.walk(func(k stateKey, e *entry) int {
		if e.idle(now) || !saveable(k, e) {
			return 1
		}
		se := savedEntry{rule: k.rule, key: k.key, span: e.w.span, touched: e.touched, isBucket: e.isBucket, gone: e.w.gone}
		if e.isBucket {
			se.b, se.gone = e.bucket(), 0
		}
		if e.isCalendar {
			se.isCal, se.gone = true, 0
			se.calStart, se.calEnd, se.calCount = e.calendar()
		}
		work := 1
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
		return work
	})
}

// walk calls fn on each counter of s under s's lock, and lets go of the
// lock every copyBatch units of work (fn returns the units it did: 1 for
// the counter, plus the slots it read), so that requests on a shard of
// many keys wait at most that long; a counter is always seen whole.
// Counters added or dropped while the lock is let go may be seen or not,
// as the language defines for a map changed during a range.
func (s *shard) walk(fn func(k stateKey, e *entry) int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	work := 0
	for k, e := range s.m {
		if work >= copyBatch {
			s.mu.Unlock()
			work = 0
			s.mu.Lock()
		}
		work += fn(k, e)
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
