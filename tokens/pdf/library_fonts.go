package pdf

import (
	"errors"
	"strings"
	"unicode/utf8"

	lib "github.com/ledongthuc/pdf"
)

// Page resources: fonts, their encodings, and form XObjects.

// libResources serves fonts and forms from a resource dictionary.
type libResources struct {
	l      *libReader
	v      lib.Value
	fonts  lib.Value
	key    string
	loaded bool
	local  map[string]decoder
	forms  map[string]*formRef // by name; nil for a name that is no form
}

func (r *libResources) font(name []byte) decoder {
	if d, ok := r.local[string(name)]; ok {
		return d
	}
	var dec decoder = rawDecoder{}
	var ck string
	var tu lib.Value
	err := r.l.call(func() {
		if !r.loaded {
			r.loaded = true
			r.fonts = r.v.Key("Font")
			r.key = r.fonts.String()
		}
		ck = r.key + "\x00" + string(name)
		if d, ok := r.l.fonts[ck]; ok {
			dec = d
			return
		}
		f := r.fonts.Key(string(name))
		if tu = f.Key("ToUnicode"); tu.Kind() != lib.Stream {
			dec = encodingDecoder(f)
		}
	})
	if err == nil && tu.Kind() == lib.Stream {
		// A ToUnicode CMap, read by this package (outside guard: a bug
		// here must show in the tests, not pass for the library's).
		data, serr := r.l.streamBytes(tu)
		if serr != nil {
			r.l.b.over = true
		} else {
			for _, d := range append([][]byte{data.main}, data.alts...) {
				if m := parseCMap(d, r.l.b); m != nil {
					dec = m
					break
				}
			}
		}
	}
	if err != nil {
		dec = rawDecoder{}
	} else if len(r.l.fonts) < maxFontCache {
		r.l.fonts[ck] = dec
	}
	if r.local == nil {
		r.local = map[string]decoder{}
	}
	if len(r.local) < maxFontCache {
		r.local[string(name)] = dec
	}
	return dec
}

// encodingDecoder builds the decoder of a font dictionary without a
// ToUnicode CMap: the library's reading of its /Encoding (the library's
// Encoder would read a ToUnicode CMap with its own interpreter: not that).
func encodingDecoder(f lib.Value) decoder {
	enc := f.Key("Encoding")
	switch enc.Kind() {
	case lib.Name:
		n := enc.Name()
		if strings.Contains(n, "UCS2") || strings.Contains(n, "UTF16") {
			return utf16Decoder{}
		}
		if strings.HasPrefix(n, "Identity") {
			return rawDecoder{}
		}
	case lib.Dict:
		if enc.Key("Differences").Len() > maxDiffs {
			return rawDecoder{}
		}
	}
	font := lib.Font{V: f}
	e := font.Encoder()
	var t tableDecoder
	for c := 0; c < 256; c++ {
		s := e.Decode(string([]byte{byte(c)}))
		if !utf8.ValidString(s) {
			s = string(rune(c))
		}
		t[c] = s
	}
	return &t
}

type tableDecoder [256]string

func (t *tableDecoder) decode(dst, raw []byte) []byte {
	for _, c := range raw {
		dst = append(dst, t[c]...)
	}
	return dst
}

type utf16Decoder struct{}

func (utf16Decoder) decode(dst, raw []byte) []byte { return appendUTF16(dst, raw) }

// formRef is a form XObject as a resource dictionary names it.
type formRef struct {
	xo  lib.Value
	key string        // the stream (its String ends with its offset) and its resources
	sub *libResources // the resources its content uses
}

func (r *libResources) form(name []byte, depth int) error {
	l := r.l
	if depth > maxFormDepth {
		l.cut = true
		return nil
	}
	f, known := r.forms[string(name)]
	if !known {
		err := l.call(func() {
			xo := r.v.Key("XObject").Key(string(name))
			if xo.Kind() != lib.Stream || xo.Key("Subtype").Name() != "Form" {
				return
			}
			res := xo.Key("Resources")
			if res.Kind() != lib.Dict {
				res = r.v
			}
			// The same form under other resources may reach other XObjects.
			f = &formRef{xo: xo, key: xo.String() + "\x00" + res.String(), sub: &libResources{l: l, v: res}}
		})
		if errors.Is(err, errOver) {
			return err
		}
		if r.forms == nil {
			r.forms = map[string]*formRef{}
		}
		if len(r.forms) < maxFontCache {
			r.forms[string(name)] = f
		}
	}
	if f == nil || l.empty[f.key] || l.active[f.key] {
		// Not a form, a form known to show nothing, or a form inside
		// itself: a cycle shows nothing more.
		return nil
	}
	data, ok := l.formData[f.key]
	if !ok {
		var err error
		data, err = l.streamBytes(f.xo)
		if err != nil {
			return err
		}
		l.formData[f.key] = data
	}
	before := l.out.n + int64(len(l.out.buf))
	cut := l.cut
	l.cut = false
	l.active[f.key] = true
	err := newInterp(l.b, l.out, f.sub, depth).run(data.main)
	for _, a := range data.alts {
		if err != nil {
			break
		}
		err = newInterp(l.b, l.out, f.sub, depth).run(a)
	}
	delete(l.active, f.key)
	if err != nil {
		return err
	}
	// A form that showed no text is not run again, unless the depth bound
	// cut it short: run from shallower, it might show some.
	if !l.cut && l.out.n+int64(len(l.out.buf)) == before && len(l.empty) < maxFontCache {
		l.empty[f.key] = true
	}
	l.cut = l.cut || cut
	return nil
}
