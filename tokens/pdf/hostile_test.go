package pdf

import (
	"bytes"
	"fmt"
	"strings"
)

// Bombs and hostile structures.

func bombCases() map[string][]byte {
	single := bombZlib(1 << 30)
	nested := zlibBytes(single)
	cases := map[string][]byte{}

	d := newDoc()
	c := d.stream("/Filter [/FlateDecode /FlateDecode]", nested)
	d.page(c)
	cases["nested page content"] = d.bytes()

	d = newDoc()
	d.textPage(show("innocent"), true)
	d.stream("/Filter [/FlateDecode /FlateDecode]", nested) // referenced by nothing
	cases["unused object"] = d.bytes()

	d = newDoc()
	d.textPage(show("innocent"), true)
	d.stream("/Filter /FlateDecode", single)
	cases["single-layer unused object"] = d.bytes()

	d = newDoc()
	d.textPage(show("innocent"), true)
	d.finish("")
	data := d.xrefStream(d.catalog)
	stm := fmt.Sprintf("%d 0 obj\n%s\nendobj\n", 99, streamBody("/Type /ObjStm /N 1 /First 4 /Filter [/FlateDecode /FlateDecode]", nested))
	cases["object stream"] = append([]byte(stm), data...)

	d = newDoc()
	d.textPage(show("innocent"), true)
	d.add("<< /Length 5 0 R /Filter /FlateDecode >> stream\n" + string(single) + "\nendstream")
	cases["indirect length"] = d.bytes()
	return cases
}

func hostileCases() map[string][]byte {
	cases := map[string][]byte{}
	plain := func(f func(d *doc)) []byte {
		d := newDoc()
		f(d)
		return d.bytes()
	}
	cases["page tree cycle"] = plain(func(d *doc) {
		d.textPage(show("one"), false)
		d.kids = append(d.kids, d.pages)
	})
	cases["parent loop"] = func() []byte {
		d := newDoc()
		n, m := d.reserve(), d.reserve()
		d.set(n, fmt.Sprintf("<< /Type /Page /Parent %d 0 R >>", m))
		d.set(m, fmt.Sprintf("<< /Type /Pages /Kids [%d 0 R] /Parent %d 0 R >>", n, n))
		d.kids = append(d.kids, n)
		return d.bytes()
	}()
	cases["self reference"] = plain(func(d *doc) {
		r := d.reserve()
		d.set(r, fmt.Sprintf("%d 0 R", r))
		p := d.add(fmt.Sprintf("<< /Type /Page /Contents %d 0 R /Resources %d 0 R >>", r, r))
		d.kids = append(d.kids, p)
	})
	cases["deep arrays"] = plain(func(d *doc) {
		deep := d.add(strings.Repeat("[", 200000) + strings.Repeat("]", 200000))
		p := d.add(fmt.Sprintf("<< /Type /Page /Contents %d 0 R >>", deep))
		d.kids = append(d.kids, p)
		d.textPage(strings.Repeat("[", 100000)+"(x) Tj", true)
	})
	cases["deep dicts"] = plain(func(d *doc) {
		d.add(strings.Repeat("<< /A ", 100000) + strings.Repeat(">> ", 100000))
	})
	cases["wide array"] = plain(func(d *doc) {
		d.add("[" + strings.Repeat("0 ", 1<<20) + "]")
	})
	cases["form fan-out"] = func() []byte {
		d := newDoc()
		next := d.stream("/Subtype /Form", []byte("BT (x) Tj ET"))
		for i := 0; i < maxFormDepth-1; i++ {
			next = d.stream(fmt.Sprintf("/Subtype /Form /Resources << /XObject << /N %d 0 R >> >>", next), []byte(strings.Repeat("/N Do ", 50)))
		}
		d.textPage(strings.Repeat("/N Do ", 50), false)
		d.finish(fmt.Sprintf("<< /XObject << /N %d 0 R >> >>", next))
		return d.table(d.catalog, "")
	}()
	cases["unterminated strings"] = bytes.Repeat([]byte("1 0 obj ("), 20000)
	cases["no endstream"] = bytes.Repeat([]byte("1 0 obj << /Length 99999999 >> stream\n"), 20000)
	cases["chained filters"] = plain(func(d *doc) {
		data := []byte(show("chained"))
		f := "/Filter ["
		for i := 0; i < maxChain; i++ {
			data = zlibBytes(data)
			f += "/Fl "
		}
		d.page(d.stream(f+"]", data))
	})
	cases["lzw bomb"] = plain(func(d *doc) { d.page(d.stream("/Filter /LZWDecode", lzwZeros(40))) })
	return cases
}
