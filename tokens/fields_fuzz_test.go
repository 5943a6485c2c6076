package tokens_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"mime/multipart"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// FuzzReadFieldsJSON: any body gives values or an ErrInvalid; on a body
// encoding/json decodes whose objects hold no two members that fold
// alike, the value at the path is what encoding/json finds there, and
// nothing is refused.
func FuzzReadFieldsJSON(f *testing.F) {
	for _, c := range [][2]string{
		{`{"model":"gpt-4o","metadata":{"user_id":"ana"}}`, "metadata.user_id"},
		{`{"Metadata":{"USER_ID":1.5e3}}`, "metadata.user_id"},
		{`{"a":[{"b":true},{"b":null}]}`, "a.1.b"},
		{`{"a":[{"b":true},{"B":false}]}`, "a.0.b"},
		{`[{"user":"x"},{"user":"y"}]`, "1.user"},
		{`{"a":{"b":"c","\u0042":"d"}}`, "a.b"},
		{`{"meſſages":[{"role":"user"}]}`, "messages.0.role"},
		{`{"a":"\ud800\udc00\u00e9"}`, "a"},
		{`{"a":{"0":"x"}}`, "a.0"},
		{`{"model":"a","model":"b"}`, "x"},
	} {
		f.Add(c[0], c[1])
	}
	f.Fuzz(func(t *testing.T, body, path string) {
		if len(path) > 64 {
			return
		}
		fields := &tokens.Fields{JSON: []string{path}}
		model, v, err := readFields("application/json", body, fields)
		if err != nil && !errors.Is(err, tokens.ErrInvalid) {
			t.Fatalf("unexpected error kind: %v", err)
		}
		if err == nil && len(v.JSON) != 1 {
			t.Fatalf("values: %+v", v)
		}
		if !utf8.ValidString(body) || depth(body) > 200 {
			return // encoding/json replaces invalid UTF-8; jsonReader stops at 256 levels
		}
		d := json.NewDecoder(strings.NewReader(body))
		d.UseNumber()
		var doc any
		if d.Decode(&doc) != nil || d.Decode(new(any)) == nil || !json.Valid([]byte(body)) || foldedTwice(body) {
			return
		}
		if batch, ok := doc.([]any); ok && !isIndex(strings.Split(path, ".")[0]) {
			// A batch: the path applies to each request, which must agree.
			var want string
			found, agree := false, true
			for _, req := range batch {
				if w, ok := at(req, strings.Split(path, ".")); ok {
					agree = agree && (!found || w == want)
					want, found = w, true
				}
			}
			if !agree {
				if err == nil {
					t.Fatalf("path %q: the batch's requests differ, yet %+v", path, v.JSON[0])
				}
				return
			}
			if err != nil || v.JSON[0].Found != found || v.JSON[0].S != want {
				t.Fatalf("batch, path %q: got %+v %v, want %q %v", path, v.JSON[0], err, want, found)
			}
			return
		}
		if err != nil {
			t.Fatalf("refused a body encoding/json reads plainly: %v", err)
		}
		want, found := at(doc, strings.Split(path, "."))
		if got := v.JSON[0]; got.Found != found || got.S != want {
			t.Fatalf("path %q: got %+v, encoding/json %q %v", path, got, want, found)
		}
		if obj, ok := doc.(map[string]any); ok {
			wantModel, _ := member(obj, "model").(string)
			if len(wantModel) > 256 {
				wantModel = wantModel[:256]
			}
			if model != wantModel {
				t.Fatalf("model %q, encoding/json %q", model, wantModel)
			}
		}
	})
}

// depth is a bound of a body's nesting.
func depth(body string) int { return strings.Count(body, "[") + strings.Count(body, "{") }

// foldedTwice reports whether any object of a valid JSON body holds two
// members whose names fold alike (a decoded map keeps only one).
func foldedTwice(body string) bool {
	d := json.NewDecoder(strings.NewReader(body))
	type frame struct {
		object bool
		keys   []string
		key    bool // the next string token is a member name
	}
	var stack []*frame
	for {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.key {
			if k, ok := tok.(string); ok {
				for _, o := range top.keys {
					if strings.EqualFold(k, o) {
						return true
					}
				}
				top.keys, top.key = append(top.keys, k), false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, key: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].key = true // a value ended: a name follows
		}
	}
}

func member(obj map[string]any, name string) any {
	for k, v := range obj {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return nil
}

// at is the value at a dotted path as the key part reads it.
func at(doc any, segs []string) (string, bool) {
	for _, seg := range segs {
		switch d := doc.(type) {
		case map[string]any:
			doc = member(d, seg)
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(d) || seg != strconv.Itoa(i) {
				return "", false
			}
			doc = d[i]
		default:
			return "", false
		}
	}
	switch d := doc.(type) {
	case string:
		return d, true
	case json.Number:
		return tokens.CanonicalNumber(string(d)), true
	case bool:
		return strconv.FormatBool(d), true
	}
	return "", false
}

// FuzzReadFieldsXML: any body gives values or an ErrInvalid, the same
// sent with an XML type or sniffed, and Estimate finds what ReadFields
// finds.
func FuzzReadFieldsXML(f *testing.F) {
	for _, c := range [][2]string{
		{`<?xml version="1.0" encoding="UTF-8"?><rDE xmlns="urn:s"><gEmis><ns2:dRucEm xmlns:ns2="urn:x">80012345</ns2:dRucEm></gEmis></rDE>`, "dRucEm"},
		{`<a><b><![CDATA[x]]>&amp;<c>y</c></b></a>`, "b"},
		{`<!DOCTYPE a [<!ENTITY e "z">]><a>&e;</a>`, "a"},
		{`<a><b></a>`, "b"},
		{`<a/><b/>`, "b"},
		{"\xef\xbb\xbf<a>x</a>", "a"},
		{`<?xml version="1.0" encoding="us-ascii"?><a>x</a>`, "a"},
	} {
		f.Add(c[0], c[1])
	}
	f.Fuzz(func(t *testing.T, body, name string) {
		fields := &tokens.Fields{XML: []string{name, "a"}}
		_, v, err := readFields("application/xml", body, fields)
		if err != nil {
			if !errors.Is(err, tokens.ErrInvalid) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		for _, x := range v.XML {
			if x.Found && strings.Trim(x.S, " \t\r\n") != x.S {
				t.Fatalf("value not trimmed: %q", x.S)
			}
		}
		if bytes.HasPrefix(bytes.TrimLeft([]byte(strings.TrimPrefix(body, "\xef\xbb\xbf")), " \t\r\n"), []byte("<")) {
			_, sniffed, err := readFields("", body, fields)
			if err != nil || !equalValues(sniffed.XML, v.XML) {
				t.Fatalf("sniffed: %+v %v; declared %+v", sniffed.XML, err, v.XML)
			}
		}
		est, err := tk.Estimate(tokens.Request{ContentType: "application/xml", Body: []byte(body), Fields: fields}, 100)
		if err != nil || !equalValues(est.Values.XML, v.XML) {
			t.Fatalf("Estimate: %+v %v; ReadFields %+v", est.Values.XML, err, v.XML)
		}
	})
}

func equalValues(a, b []tokens.Value) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzReadFieldsForm: any body gives values or an ErrInvalid; where Go's
// own parsers (url.ParseQuery, multipart.Reader.ReadForm) read the body
// without error, a field is found with the value they read, a field they
// read twice is refused, and a form they read plainly is not refused.
func FuzzReadFieldsForm(f *testing.F) {
	f.Add("user=eve&x=1", "user", false)
	f.Add("%75ser=a+b&user=c", "user", false)
	f.Add("a=1;user=2", "user", false)
	f.Add("user=%zz&x=%", "x", false)
	f.Add("--b\r\nContent-Disposition: form-data; name=\"user\"\r\n\r\neve\r\n--b--\r\n", "user", true)
	f.Add("--b\r\nContent-Disposition: form-data; name=\"user\"; filename=\"\"\r\n\r\nx\r\n--b\r\nContent-Disposition: form-data; name=\"user\"\r\n\r\neve\r\n--b--\r\n", "user", true)
	f.Fuzz(func(t *testing.T, body, name string, isMultipart bool) {
		ct := "application/x-www-form-urlencoded"
		if isMultipart {
			ct = "multipart/form-data; boundary=b"
		}
		_, v, err := readFields(ct, body, &tokens.Fields{Form: []string{name}})
		if err != nil && !errors.Is(err, tokens.ErrInvalid) {
			t.Fatalf("unexpected error kind: %v", err)
		}
		var goVals url.Values
		if isMultipart {
			form, ferr := multipart.NewReader(strings.NewReader(body), "b").ReadForm(1 << 20)
			if ferr != nil {
				return
			}
			goVals = form.Value
		} else {
			vals, perr := url.ParseQuery(body)
			if perr != nil || strings.Contains(body, ";") {
				return
			}
			goVals = vals
		}
		if !isMultipart && strings.HasPrefix(strings.TrimLeft(body, " \t\r\n"), "{") {
			return // also read as JSON
		}
		switch vs := goVals[name]; {
		case len(vs) > 1:
			if err == nil {
				t.Fatalf("%q twice (%q), not refused", name, vs)
			}
		case err != nil:
			if strings.Contains(err.Error(), `duplicate member "model"`) {
				return // a repeated model (in any spelling), refused on its own
			}
			t.Fatalf("refused: %v (Go reads %q)", err, vs)
		case len(vs) == 1:
			if !v.Form[0].Found || v.Form[0].S != vs[0] {
				t.Fatalf("got %+v, Go reads %q", v.Form[0], vs[0])
			}
		default:
			if v.Form[0].Found {
				t.Fatalf("got %+v, Go reads none", v.Form[0])
			}
		}
	})
}

func isIndex(seg string) bool {
	if seg == "" || len(seg) > 9 || len(seg) > 1 && seg[0] == '0' {
		return false
	}
	for i := 0; i < len(seg); i++ {
		if seg[i] < '0' || seg[i] > '9' {
			return false
		}
	}
	return true
}
