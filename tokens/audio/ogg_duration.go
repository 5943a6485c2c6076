package audio

import ()

// A stream's duration, and Opus packets' samples.

// ns is how long a stream lasts: the most of its largest granule position
// and of its packets, less Opus's pre-skip, at its sample rate.
func (s *oggStream) ns() int64 {
	n := max(s.gmax, s.samples)
	if s.kind == oggOpus {
		n -= min(n, s.preskip)
	}
	if n <= 0 || s.rate <= 0 {
		return 0
	}
	return mulDivCeil(n, 1e9, s.rate)
}

// oggNs is the duration of an Ogg file: its streams one after the other
// (chained) or side by side (multiplexed) added up, pages found inside
// pages, and bytes in no page at 16 kbit/s. FLAC streams last the most of
// their granule positions and the FLAC frames in the file.
func (m *Meter) oggNs() int64 {
	o := &m.ogg
	d := addSat(o.done, o.nested)
	fl := o.doneFLAC
	for i := range o.streams {
		s := &o.streams[i]
		switch {
		case !s.used:
		case s.kind == oggFLAC:
			fl = addSat(fl, s.ns())
		default:
			d = addSat(d, s.ns())
		}
	}
	if o.flac {
		fl = max(fl, m.flac.ns())
	}
	d = addSat(d, fl)
	return addSat(d, bytesNs(m.garbage, fallbackRate))
}

// opusSamples is how long an Opus packet lasts, in 48 kHz samples, from
// its TOC byte (RFC 6716, 3.1); a packet a decoder cannot read counts as
// the longest.
func opusSamples(pk []byte) int64 {
	if len(pk) == 0 {
		return opusMaxPacket
	}
	toc := pk[0]
	cfg := toc >> 3
	var size int64
	switch {
	case cfg < 12: // SILK: 10, 20, 40, 60 ms
		size = [4]int64{480, 960, 1920, 2880}[cfg&3]
	case cfg < 16: // hybrid: 10, 20 ms
		size = [2]int64{480, 960}[cfg&1]
	default: // CELT: 2.5, 5, 10, 20 ms
		size = [4]int64{120, 240, 480, 960}[cfg&3]
	}
	n := int64(1)
	switch toc & 3 {
	case 1, 2:
		n = 2
	case 3:
		if len(pk) < 2 || pk[1]&0x3F == 0 {
			return opusMaxPacket
		}
		n = int64(pk[1] & 0x3F)
	}
	if n*size > opusMaxPacket {
		return opusMaxPacket
	}
	return n * size
}
