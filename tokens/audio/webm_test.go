package audio

import (
	"testing"
	"time"
)

// webmHour declares an hour (3,600,000 ms ticks) and holds a second of
// Opus; webmSmall is under 1 KB.
var (
	webmHour  = cat(ebmlHead, ebml(idSegment, 0, webmInfo(1000000, 3600000), webmTracksOf("A_OPUS"), webmCluster(0, 0, 1, 20, repeat(opus20, 50)...)))
	webmSmall = cat(ebmlHead, ebml(idSegment, 0, webmInfo(1000000, 3600000), webmTracksOf("A_OPUS"), webmCluster(0, 0, 1, 20, repeat(opus20, 10)...)))
)

func TestWebM(t *testing.T) {
	seg := func(parts ...[]byte) []byte { return cat(ebmlHead, ebml(idSegment, 0, parts...)) }
	opus := webmTracksOf("A_OPUS")
	// Browsers record with a Segment and Clusters of unknown size and no
	// Duration.
	browser := func(n int) []byte {
		b := cat(ebmlHead, ebml(idSegment, -1, webmInfo(1000000, -1), opus))
		for c := range n {
			b = append(b, webmCluster(-1, uint64(c)*1000, 1, 20, repeat(opus20, 50)...)...)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want time.Duration
	}{
		{"Duration", webmHour, time.Hour},
		{"Duration as float32", seg(ebml(idInfo, 0, ebmlFloat(idDuration, 90000, 4)), opus), 90 * time.Second},
		{"TimecodeScale", seg(webmInfo(1000, 5000000), opus), 5 * time.Second},
		{"TimecodeScale after Duration", seg(ebml(idInfo, 0, ebmlFloat(idDuration, 5000000, 8), ebmlUint(idTimecodeScal, 1000)), opus), 5 * time.Second},
		// A Duration that lies small: the Opus packets count.
		{"Duration lies small", seg(webmInfo(1000000, 1000), opus, webmCluster(0, 0, 1, 0, repeat(opus120, 30000)...)), time.Hour},
		// So do the block timestamps.
		{"timestamps say more", seg(webmInfo(1000000, 1000), opus, webmCluster(0, 7200000, 1, 0, opus20)), 2*time.Hour + 20*time.Millisecond},
		{"browser recording", browser(3), 3 * time.Second},
		{"browser recording, cut", browser(3)[:len(browser(3))-200], 2740 * time.Millisecond}, // 13 blocks of 15 bytes cut
		// Laced blocks: each packet as the longest.
		{"laced", seg(webmInfo(1000000, 10), opus, ebml(idCluster, 0, ebmlUint(idTimecode, 0), simpleBlock(1, 0, 0x86, []byte{9, 1, 2, 3}))), 10 * 120 * time.Millisecond},
		{"block group", seg(webmInfo(1000000, 10), opus, ebml(idCluster, 0, ebmlUint(idTimecode, 0),
			ebml(idBlockGroup, 0, ebml(idBlock, 0, []byte{0x81, 0, 0, 0}, opus120), ebmlUint(0x9B, 120)))), 120 * time.Millisecond},
		// Without a Duration, blocks of other codecs cost their size.
		{"Vorbis without Duration", seg(webmInfo(1000000, -1), webmTracksOf("A_VORBIS"), webmCluster(0, 0, 1, 0, repeat(pcm(1000), 20)...)), fallback(20*1000 + 20*4)},
		{"no Duration, no blocks", seg(webmInfo(1000000, -1), opus), fallback(len(seg(webmInfo(1000000, -1), opus)))},
		// Bytes that cannot be read: passed over to the next Cluster, at
		// 16 kbit/s when that is more.
		{"garbage then a cluster", cat(ebmlHead, ebml(idSegment, -1, webmInfo(1000000, 1000), opus), []byte{0, 0, 0}, pcm(4000), webmCluster(0, 0, 1, 0, repeat(opus120, 1000)...)), 2 * time.Minute},
		{"garbage", cat(ebmlHead, ebml(idSegment, -1, webmInfo(1000000, 1000), opus), []byte{0, 0, 0}, pcm(40000)), fallback(40003)},
		{"element larger than its parent", cat(ebmlHead, ebml(idSegment, 0, webmInfo(1000000, 1000), opus, ebml(idCluster, 0, ebmlUint(idTimecode, 0), []byte{0xA3, 0x10, 0, 0, 0, 0, 0, 0x01})), webmCluster(0, 0, 1, 0, repeat(opus120, 1000)...)), 2 * time.Minute},
		{"unknown top-level element", cat(ebmlHead, ebml(0x10ABCDEF, 0, pcm(6000)), ebml(idSegment, 0, webmInfo(1000000, 1000), opus)), fallback(6000 + 6)},
	} {
		got := measure(tc.b, 0)
		within(t, tc.name, got, tc.want, fallback(10))
		for _, p := range []int{1, 2, 5, 4096} {
			if q := measure(tc.b, p); q != got {
				t.Errorf("%s in pieces of %d: %v, whole %v", tc.name, p, q, got)
			}
		}
	}
}

func TestWebMPieces(t *testing.T) {
	for name, b := range map[string][]byte{"small": webmSmall, "browser": cat(ebmlHead, ebml(idSegment, -1, webmInfo(1000000, -1), webmTracksOf("A_OPUS"), webmCluster(-1, 0, 1, 20, repeat(opus20, 20)...)))} {
		whole := measure(b, 0)
		for p := 1; p <= len(b); p++ {
			if got := measure(b, p); got != whole {
				t.Fatalf("%s in pieces of %d: %v, whole %v", name, p, got, whole)
			}
		}
	}
}
