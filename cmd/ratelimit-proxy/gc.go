package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// The collector runs when the heap has grown by GOGC % of the live heap.
// While the live heap is small (mostly the tokenizer's tables, which every
// collection scans) collecting at 5× rather than 2× the live heap saves
// ~5 % of CPU per request; peak RSS under 100 concurrent 10 MiB uploads
// stays ~115 MiB (tests/bench/uploads.sh). But the live heap grows with the
// callers held in memory, and 5× of it does not stay small: 200,000
// callers took the process past 300 MB. So GOGC shrinks as the live heap
// grows, keeping the room between collections at gcHeadroom, and never
// below 100 (Go's default). GOGC in the environment still wins.
const (
	gcHeadroom   = 64 << 20
	gcMaxPercent = 400
	gcMinPercent = 100
)

// gcPercentFor is the GOGC for a live heap of live bytes.
func gcPercentFor(live uint64) int {
	if live == 0 {
		return gcMaxPercent
	}
	return int(min(max(gcHeadroom*100/live, gcMinPercent), gcMaxPercent))
}

// gcPacer sets GOGC after each collection from the live heap it left.
type gcPacer struct {
	mu      sync.Mutex
	percent int
	sample  []metrics.Sample
}

// paceGC sets GOGC for the live heap now and after every collection.
func paceGC() {
	p := &gcPacer{sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	p.adjust()
	p.arm()
}

// arm runs adjust after the next collection: the cleanup of an object
// nothing references runs once a collection has found it unreachable.
func (p *gcPacer) arm() {
	runtime.AddCleanup(new(gcSentinel), func(p *gcPacer) {
		p.adjust()
		p.arm()
	}, p)
}

// gcSentinel is large enough not to share a tiny allocation block, whose
// cleanup could then wait for its neighbours.
type gcSentinel [32]byte

func (p *gcPacer) adjust() {
	p.mu.Lock()
	defer p.mu.Unlock()
	metrics.Read(p.sample)
	var live uint64
	if p.sample[0].Value.Kind() == metrics.KindUint64 {
		live = p.sample[0].Value.Uint64()
	}
	// Setting GOGC stops the world for a moment: only a change of a tenth
	// or more is worth it.
	if n := gcPercentFor(live); p.percent == 0 || 10*abs(n-p.percent) >= p.percent {
		p.percent = n
		debug.SetGCPercent(n)
	}
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
