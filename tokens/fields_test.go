package tokens_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// missing marks a key part the body lacks in a want list.
const missing = "\x00missing"

func readFields(ct, body string, f *tokens.Fields) (string, tokens.Values, error) {
	return tk.ReadFields(tokens.Request{Format: tokens.FormatGeneric, ContentType: ct, Body: []byte(body), Fields: f})
}

// got renders values as a want list.
func got(vals []tokens.Value) []string {
	out := make([]string, len(vals))
	for i, v := range vals {
		out[i] = missing
		if v.Found {
			out[i] = v.S
		}
	}
	return out
}

type fieldCase struct {
	name, ct, body string
	want           []string // one per path or name; missing when not found
	err            string   // a substring of the ErrInvalid message; "" for none
}

func checkFields(t *testing.T, c fieldCase, f *tokens.Fields, pick func(tokens.Values) []tokens.Value) {
	t.Helper()
	_, v, err := readFields(c.ct, c.body, f)
	if c.err != "" {
		if !errors.Is(err, tokens.ErrInvalid) || !strings.Contains(err.Error(), c.err) {
			t.Fatalf("%s: want an ErrInvalid with %q, got %v", c.name, c.err, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	if g := got(pick(v)); fmt.Sprintf("%q", g) != fmt.Sprintf("%q", c.want) {
		t.Fatalf("%s: got %q, want %q", c.name, g, c.want)
	}
}

func TestJSONFields(t *testing.T) {
	paths := []string{"metadata.user_id", "model", "messages.1.role", "n", "flag"}
	m := missing
	long := strings.Repeat("é", 2000)
	tests := []fieldCase{
		{"plain", "", `{"model":"gpt-4o","metadata":{"user_id":"ana"},"messages":[{"role":"system"},{"role":"user"}],"n":2,"flag":true}`,
			[]string{"ana", "gpt-4o", "user", "2", "true"}, ""},
		{"folded members", "", `{"MoDeL":"x","Metadata":{"USER_ID":"ana"},"meſſages":[{},{"Role":"tool"}],"N":-1.5e3,"FLAG":false}`,
			[]string{"ana", "x", "tool", "-1500", "false"}, ""},
		{"escaped member names and values", "", `{"mod\u0065l":"a\u00e9\n\ud83d\ude00","metadat\u0061":{"user\u005fid":"\"q\""}}`,
			[]string{`"q"`, "a\u00e9\n\U0001F600", m, m, m}, ""},
		{"Kelvin sign folds to k", "", `{"metadata":{"user_id":"a"},"flag":"\u212a"}`, []string{"a", m, m, m, "\u212a"}, ""},
		{"missing", "", `{"metadata":{},"messages":[{"role":"user"}]}`, []string{m, m, m, m, m}, ""},
		{"null, object and array are not found", "", `{"metadata":{"user_id":null},"model":{"a":1},"n":[1],"flag":null}`,
			[]string{m, m, m, m, m}, ""},
		{"a path through a string", "", `{"metadata":"user_id","messages":"x"}`, []string{m, m, m, m, m}, ""},
		{"long value in full", "", `{"metadata":{"user_id":"` + long + `"}}`, []string{long, m, m, m, m}, ""},
		{"nested objects elsewhere are skipped", "", `{"a":{"metadata":{"user_id":"no"}},"metadata":{"x":{"user_id":"no"},"user_id":"yes"}}`,
			[]string{"yes", m, m, m, m}, ""},
		{"duplicate leaf in another spelling", "", `{"metadata":{"user_id":"a","USER_ID":"b"}}`, nil, `duplicate member "metadata.user_id"`},
		{"duplicate leaf with ſ", "", `{"metadata":{"user_id":"a","uſer_id":"b"}}`, nil, `duplicate member "metadata.user_id"`},
		{"duplicate object on the path", "", `{"metadata":{"user_id":"a"},"Metadat\u0061":{}}`, nil, `duplicate member "metadata"`},
		{"duplicate inside the indexed element", "", `{"messages":[{},{"role":"user","ROLE":"system"}]}`, nil, `duplicate member "messages.1.role"`},
		{"duplicate found at the very end", "", `{"metadata":{"user_id":"a"},"x":"` + strings.Repeat("y", 100000) + `","metadata":1}`, nil, `duplicate member "metadata"`},
		{"duplicate model without a path to it", "", `{"model":"a","messages":[],"Model":"b"}`, nil, `duplicate member "model"`},
		{"duplicates off the path are fine", "", `{"messages":[{"role":"a","role":"b"},{"role":"c"}],"other":{"x":1,"x":2}}`,
			[]string{m, m, "c", m, m}, ""},
		{"a long member name is no member", "", `{"metadata":{"` + strings.Repeat("x", 5000) + `user_id":"fake"}}`, []string{m, m, m, m, m}, ""},
		{"invalid UTF-8", "", "{\"metadata\":{\"user_id\":\"\xff\"}}", nil, "UTF-8"},
		{"invalid UTF-8 elsewhere", "", "{\"metadata\":{\"user_id\":\"a\"},\"x\":\"\xc3\"}", nil, "UTF-8"},
		{"byte order mark", "application/json", "\xef\xbb\xbf{\"model\":\"a\"}", nil, "at byte 0"},
		{"byte order mark, sniffed", "text/plain", "\xef\xbb\xbf{\"model\":\"a\"}", nil, "byte order mark"},
		{"trailing document", "", `{"model":"a"}{"model":"b"}`, nil, "after the top-level value"},
		{"truncated", "", `{"model":"a"`, nil, "end of input"},
		{"text that only looks like JSON", "text/plain", `{"metadata":{"user_id":"a"}, oops`, []string{m, m, m, m, m}, ""},
		{"JSON sent as text", "text/plain", `{"metadata":{"user_id":"a"}}`, []string{"a", m, m, m, m}, ""},
		{"JSON sent as text, duplicated", "text/plain", `{"metadata":{"user_id":"a","user_id":"b"}}`, nil, "duplicate member"},
	}
	for _, c := range tests {
		if c.ct == "" {
			c.ct = "application/json"
		}
		checkFields(t, c, &tokens.Fields{JSON: paths}, func(v tokens.Values) []tokens.Value { return v.JSON })
	}
}

func TestJSONFieldPaths(t *testing.T) {
	m := missing
	tests := []struct {
		paths []string
		fieldCase
	}{
		{[]string{"0.user", "1.user", "0"}, fieldCase{"a batch by index", "", `[{"user":"a"},{"user":"b"}]`, []string{"a", "b", m}, ""}},
		{[]string{"0.user"}, fieldCase{"a duplicate model inside a batch", "", `[{"user":"a","model":"x","MODEL":"y"}]`, nil, `duplicate member "model"`}},
		{[]string{"a.0", "a.01", "b.0"}, fieldCase{"a digit segment names a member too", "", `{"a":["x"],"b":{"0":"y","01":"z"}}`, []string{"x", m, "y"}, ""}},
		{[]string{"Metadata.User_Id", "metadata.user_id"}, fieldCase{"paths spelled differently share a member", "", `{"metadata":{"USER_ID":"a"}}`, []string{"a", "a"}, ""}},
		{[]string{"a", "a.b"}, fieldCase{"a path and its extension", "", `{"a":{"b":1}}`, []string{m, "1"}, ""}},
		{[]string{"x."}, fieldCase{"an empty segment names the empty member", "", `{"x":{"":"e"}}`, []string{"e"}, ""}},
		{[]string{"s"}, fieldCase{"numbers in one spelling per value", "", `{"s":1.50E+02}`, []string{"150"}, ""}},
	}
	for _, c := range tests {
		if c.ct == "" {
			c.ct = "application/json"
		}
		checkFields(t, c.fieldCase, &tokens.Fields{JSON: c.paths}, func(v tokens.Values) []tokens.Value { return v.JSON })
	}
}

func sifen(inner string) string {
	return `<?xml version="1.0" encoding="UTF-8"?>` + "\n" + `<rDE xmlns="http://ekuatia.set.gov.py/sifen/xsd"><DE Id="1"><gDatGralOpe><gEmis>` +
		inner + `</gEmis></gDatGralOpe></DE></rDE>`
}

func TestXMLFields(t *testing.T) {
	names := []string{"dRucEm", "dDVEmi"}
	m := missing
	tests := []fieldCase{
		{"SIFEN, default namespace", "application/xml", sifen(`<dRucEm>80012345</dRucEm><dDVEmi>6</dDVEmi>`), []string{"80012345", "6"}, ""},
		{"prefixed namespace", "text/xml", sifen(`<ns2:dRucEm xmlns:ns2="urn:x">80012345</ns2:dRucEm>`), []string{"80012345", m}, ""},
		{"undeclared prefix", "application/soap+xml", `<env:Body><p:dRucEm>1</p:dRucEm></env:Body>`, []string{"1", m}, ""},
		{"CDATA, entities and white space", "application/xml", "<a><dRucEm>\n  <![CDATA[80<0]]>&amp;&#49;&#x32;\t</dRucEm></a>", []string{"80<0&12", m}, ""},
		{"nested elements' text", "application/xml", `<a><dRucEm>800<b>123</b><!-- 9 -->45<?pi x?></dRucEm></a>`, []string{"80012345", m}, ""},
		{"the first element wins", "application/xml", `<a><dRucEm>1</dRucEm><dRucEm>2</dRucEm></a>`, []string{"1", m}, ""},
		{"nested same name: the outer one", "application/xml", `<dRucEm>a<dRucEm>b</dRucEm>c</dRucEm>`, []string{"abc", m}, ""},
		{"one name inside the other", "application/xml", `<dDVEmi>x<dRucEm>1</dRucEm></dDVEmi>`, []string{"1", "x1"}, ""},
		{"names are case-sensitive", "application/xml", `<a><DRUCEM>1</DRUCEM></a>`, []string{m, m}, ""},
		{"in a comment is no element", "application/xml", `<a><!-- <dRucEm>9</dRucEm> --><dRucEm>1</dRucEm></a>`, []string{"1", m}, ""},
		{"empty element", "application/xml", `<a><dRucEm/></a>`, []string{"", m}, ""},
		{"missing", "application/xml", `<rDE/>`, []string{m, m}, ""},
		{"empty body", "application/xml", ``, []string{m, m}, ""},
		{"sniffed without a type", "", "\n <a><dRucEm>7</dRucEm></a>", []string{"7", m}, ""},
		{"sniffed in text/plain", "text/plain", `<a><dRucEm>7</dRucEm></a>`, []string{"7", m}, ""},
		{"not XML without the type", "text/plain", `dRucEm=7`, []string{m, m}, ""},
		{"UTF-8 byte order mark", "application/xml", "\xef\xbb\xbf<a><dRucEm>7</dRucEm></a>", []string{"7", m}, ""},
		{"us-ascii", "application/xml; charset=US-ASCII", `<?xml version="1.0" encoding="us-ascii"?><dRucEm>7</dRucEm>`, []string{"7", m}, ""},
		{"stops once found", "application/xml", `<a><dRucEm>1</dRucEm><dDVEmi>2</dDVEmi><oops></a>`, []string{"1", "2"}, ""},
		{"malformed before", "application/xml", `<a><b></a><dRucEm>1</dRucEm>`, nil, "invalid XML at line 1"},
		{"unquoted attribute", "application/xml", `<a x=1><dRucEm>1</dRucEm></a>`, nil, "invalid XML"},
		{"unknown entity", "application/xml", `<a><dRucEm>&x;</dRucEm></a>`, nil, "invalid XML"},
		{"DOCTYPE entity", "application/xml", `<!DOCTYPE a [<!ENTITY e "9">]><a>&e;<dRucEm>1</dRucEm></a>`, nil, "invalid XML"},
		{"unclosed", "application/xml", `<a><dRucEm>1`, nil, "invalid XML"},
		{"a second root", "application/xml", `<a/><dRucEm>1</dRucEm>`, nil, "after the root"},
		{"text outside the root", "application/xml", `x<dRucEm>1</dRucEm>`, nil, "outside the root"},
		{"not XML with the type", "application/xml", `dRucEm=1`, nil, "outside the root"},
		{"latin-1 declared", "application/xml", `<?xml version="1.0" encoding="ISO-8859-1"?><dRucEm>1</dRucEm>`, nil, "must be UTF-8"},
		{"latin-1 in the type", "application/xml; charset=iso-8859-1", `<dRucEm>1</dRucEm>`, nil, "must be UTF-8"},
		{"not ASCII in us-ascii", "application/xml", "<?xml version=\"1.0\" encoding=\"us-ascii\"?><dRucEm>\xc3\xa9</dRucEm>", nil, "must be UTF-8"},
		{"UTF-16", "", "\xff\xfe<\x00a\x00/\x00>\x00", nil, "must be UTF-8"},
		{"UTF-16 without a mark", "application/xml", "\x00<\x00a\x00/\x00>", nil, "must be UTF-8"},
		{"invalid UTF-8", "application/xml", "<a>\xff<dRucEm>1</dRucEm></a>", nil, "invalid XML"},
		{"too deep", "application/xml", strings.Repeat("<a>", 1001) + "<dRucEm>1</dRucEm>", nil, "nesting deeper than 1000"},
	}
	for _, c := range tests {
		checkFields(t, c, &tokens.Fields{XML: names}, func(v tokens.Values) []tokens.Value { return v.XML })
	}
	// The message never quotes the body.
	_, _, err := readFields("application/xml", `<a><secret></a>`, &tokens.Fields{XML: names})
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("error quotes the body: %v", err)
	}
	// 1000 levels are fine.
	body := strings.Repeat("<a>", 999) + "<dRucEm>1</dRucEm>" + strings.Repeat("</a>", 999)
	checkFields(t, fieldCase{"1000 levels", "application/xml", body, []string{"1", m}, ""}, &tokens.Fields{XML: names},
		func(v tokens.Values) []tokens.Value { return v.XML })
}

func part(name, value string) string {
	return "--b\r\nContent-Disposition: form-data; name=\"" + name + "\"\r\n\r\n" + value + "\r\n"
}

func TestFormFields(t *testing.T) {
	names := []string{"user", "org"}
	m := missing
	const form, mp = "application/x-www-form-urlencoded", "multipart/form-data; boundary=b"
	tests := []fieldCase{
		{"URL-encoded", form, "user=eve&x=1&org=acme", []string{"eve", "acme"}, ""},
		{"escapes", form, "%75ser=a+b%20c&org=%E2%82%AC", []string{"a b c", "€"}, ""},
		{"as sent, not trimmed", form, "user=+a+&org=", []string{" a ", ""}, ""},
		{"no value", form, "user&&org", []string{"", ""}, ""},
		{"case-sensitive", form, "User=a&USER=b", []string{m, m}, ""},
		{"missing", form, "x=1", []string{m, m}, ""},
		{"twice", form, "user=a&x=1&user=b", nil, `duplicate member "user"`},
		{"twice, once escaped", form, "user=a&%75ser=b", nil, `duplicate member "user"`},
		{"semicolon in the value", form, "user=a;x=1", nil, `ambiguous form field "user"`},
		{"semicolon before the name", form, "x=1;user=b", nil, `ambiguous form field "user"`},
		{"invalid escape", form, "user=%zz", nil, `ambiguous form field "user"`},
		{"semicolons elsewhere are fine", form, "x=1;y=2&user=a", []string{"a", m}, ""},
		{"invalid escapes elsewhere are fine", form, "x=%zz&user=a", []string{"a", m}, ""},
		{"multipart", mp, part("user", "eve") + part("org", " acme\n") + "--b--\r\n", []string{"eve", " acme\n"}, ""},
		{"multipart twice", mp, part("user", "a") + part("user", "b") + "--b--\r\n", nil, `duplicate member "user"`},
		{"multipart file part is no field", mp,
			"--b\r\nContent-Disposition: form-data; name=\"user\"; filename=\"u.txt\"\r\n\r\nfile\r\n" + part("user", "eve") + "--b--\r\n",
			[]string{"eve", m}, ""},
		{"a file to some parsers, a value to Go's: a copy", mp,
			"--b\r\nContent-Disposition: form-data; name=\"user\"; filename=\"\"\r\n\r\nx\r\n" + part("user", "eve") + "--b--\r\n",
			nil, `duplicate member "user"`},
		{"multipart model twice", mp, part("model", "a") + part("MODEL", "b") + "--b--\r\n", nil, `duplicate member "model"`},
		{"multipart truncated", mp, part("user", "eve"), nil, "multipart"},
		{"JSON as a form is also a form", form, `{"x":"&user=bob&"}`, []string{"bob", m}, ""},
		{"JSON is no form", "application/json", `{"user":"a"}`, []string{m, m}, ""},
	}
	for _, c := range tests {
		checkFields(t, c, &tokens.Fields{Form: names}, func(v tokens.Values) []tokens.Value { return v.Form })
	}
	// A form over 1 MiB is read as a stream.
	big := "x=" + strings.Repeat("a", 2<<20) + "&user=eve&org=" + strings.Repeat("o", 1<<20)
	checkFields(t, fieldCase{"large", form, big, []string{"eve", strings.Repeat("o", 1<<20)}, ""}, &tokens.Fields{Form: names},
		func(v tokens.Values) []tokens.Value { return v.Form })
	checkFields(t, fieldCase{"large, twice", form, big + "&user=x", nil, "duplicate member"}, &tokens.Fields{Form: names},
		func(v tokens.Values) []tokens.Value { return v.Form })
}

// ReadFields finds the model as Estimate does, and without fields reads
// the whole body for a repeated model.
func TestReadFieldsModel(t *testing.T) {
	for _, c := range []struct{ ct, body, model, err string }{
		{"application/json", `{"messages":[],"mod\u0065l":"gpt-4o"}`, "gpt-4o", ""},
		{"application/json", `{"model":"a","messages":[],"model":"b"}`, "", "duplicate member"},
		{"application/json", `{"model":"a","stream":true,"STREAM":false}`, "", "duplicate member"},
		{"application/json", `{"model":"a"} x`, "", "after the top-level value"},
		{"text/plain", `{"model":"a", oops`, "", ""},
		{"multipart/form-data; boundary=b", part("Model", " gpt-4o ") + "--b--\r\n", "gpt-4o", ""},
		{"multipart/form-data; boundary=b", part("model", "a") + part("x", "y") + part("model", "b") + "--b--\r\n", "", "duplicate member"},
		{"application/x-www-form-urlencoded", "model=gpt-4o&x=1", "gpt-4o", ""},
		{"application/x-www-form-urlencoded", "model=a&MODEL=b", "", "duplicate member"},
		{"application/xml", "<model>a</model>", "", ""},
	} {
		model, _, err := readFields(c.ct, c.body, nil)
		if c.err != "" {
			if !errors.Is(err, tokens.ErrInvalid) || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s %q: want %q, got %v", c.ct, c.body, c.err, err)
			}
			continue
		}
		if err != nil || model != c.model {
			t.Errorf("%s %q: got %q, %v; want %q", c.ct, c.body, model, err, c.model)
		}
	}
	// A model given by the request overrides the body's.
	body := `{"model":"a"}`
	model, _, err := tk.ReadFields(tokens.Request{ContentType: "application/json", Body: []byte(body), Model: "b"})
	if err != nil || model != "b" {
		t.Fatalf("override: %q %v", model, err)
	}
}

// Estimate with Fields counts what it counts without them, and finds the
// same values ReadFields finds, for every API format.
func TestEstimateWithFields(t *testing.T) {
	f := &tokens.Fields{JSON: []string{"metadata.user_id", "user"}, XML: []string{"dRucEm"}, Form: []string{"user"}}
	m := missing
	tests := []struct {
		format   tokens.Format
		ct, body string
		json     []string
		xml      []string
		form     []string
	}{
		{tokens.FormatChat, "application/json", `{"model":"gpt-4o","metadata":{"user_id":"ana"},"messages":[{"role":"user","content":"Hello there"}],"user":"u1"}`,
			[]string{"ana", "u1"}, []string{m}, []string{m}},
		{tokens.FormatCompletions, "application/json", `{"model":"gpt-3.5-turbo-instruct","prompt":["a","b"],"suffix":"c","user":7}`,
			[]string{m, "7"}, []string{m}, []string{m}},
		{tokens.FormatEmbeddings, "application/json", `{"model":"text-embedding-3-small","input":"hello","USER":"x"}`,
			[]string{m, "x"}, []string{m}, []string{m}},
		{tokens.FormatResponses, "application/json", `{"model":"gpt-4.1","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"metadata":{"User_Id":"r"}}`,
			[]string{"r", m}, []string{m}, []string{m}},
		{tokens.FormatMessages, "application/json", `{"model":"claude-sonnet-4","system":"s","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"metadata":{"user_id":"anthropic-user"}}`,
			[]string{"anthropic-user", m}, []string{m}, []string{m}},
		{tokens.FormatSeedChat, "application/json", `{"message":"hello","system":"s","history":[],"user":"seed"}`,
			[]string{m, "seed"}, []string{m}, []string{m}},
		{tokens.FormatSeedChat, "multipart/form-data; boundary=b", part("message", "hello") + part("user", "mp") + "--b--\r\n",
			[]string{m, m}, []string{m}, []string{"mp"}},
		{tokens.FormatSeedChat, "application/x-www-form-urlencoded", "message=hello&user=form", []string{m, m}, []string{m}, []string{"form"}},
		{tokens.FormatSeedChat, "application/x-www-form-urlencoded", `{"message":"hi","user":"j","x":"&user=f&"}`, []string{m, "j"}, []string{m}, []string{"f"}},
		{tokens.FormatGeneric, "application/xml", sifen(`<dRucEm>80012345</dRucEm>`), []string{m, m}, []string{"80012345"}, []string{m}},
		{tokens.FormatGeneric, "text/plain", `{"user":"not JSON after all", }`, []string{m, m}, []string{m}, []string{m}},
		{tokens.FormatChat, "application/json", `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("word ", 5000) + `"}],"user":"late"}`,
			[]string{m, "late"}, []string{m}, []string{m}},
	}
	for i, c := range tests {
		req := tokens.Request{Format: c.format, ContentType: c.ct, Body: []byte(c.body)}
		for _, limit := range []int{-1, 10} {
			plain, err := tk.Estimate(req, limit)
			if err != nil {
				t.Fatalf("%d: %v", i, err)
			}
			req.Fields = f
			est, err := tk.Estimate(req, limit)
			req.Fields = nil
			if err != nil {
				t.Fatalf("%d: with fields: %v", i, err)
			}
			if est.Tokens != plain.Tokens || est.Model != plain.Model || est.Encoding != plain.Encoding || est.Stopped != plain.Stopped {
				t.Fatalf("%d, limit %d: with fields %+v, without %+v", i, limit, est, plain)
			}
			for _, k := range []struct {
				got  []tokens.Value
				want []string
			}{{est.Values.JSON, c.json}, {est.Values.XML, c.xml}, {est.Values.Form, c.form}} {
				if g := got(k.got); fmt.Sprintf("%q", g) != fmt.Sprintf("%q", k.want) {
					t.Fatalf("%d, limit %d: got %q, want %q", i, limit, g, k.want)
				}
			}
			req.Fields = f
			model, v, err := tk.ReadFields(req)
			req.Fields = nil
			if err != nil || model != est.Model || fmt.Sprint(v) != fmt.Sprint(est.Values) {
				t.Fatalf("%d: ReadFields %q %v %v; Estimate %q %v", i, model, v, err, est.Model, est.Values)
			}
		}
	}
	// Every disguise of disguise_test.go counts the same with fields.
	for _, d := range disguises {
		body, ct := d.body("Hello there"), d.ct
		switch ct {
		case "":
			ct = "application/json"
		case "multipart":
			body, ct = multipartBody(t, map[string]string{"message": "hi", "context_notes": body})
		}
		req := tokens.Request{Format: d.format, ContentType: ct, Body: []byte(body)}
		plain, err := tk.Estimate(req, -1)
		req.Fields = f
		est, ferr := tk.Estimate(req, -1)
		if err != nil || ferr != nil || est.Tokens != plain.Tokens || est.Model != plain.Model {
			t.Errorf("%s: with fields %+v %v, without %+v %v", d.name, est, ferr, plain, err)
		}
	}
	// Without Fields, no Values.
	body := `{"model":"gpt-4o","user":"a"}`
	est := estimate(t, tokens.FormatChat, "application/json", body, -1)
	if est.Values.JSON != nil || est.Values.XML != nil || est.Values.Form != nil {
		t.Fatalf("values without fields: %+v", est.Values)
	}
	// A duplicate the count never reaches (it stopped at the cap) is
	// still found when the key reads it.
	body = `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("word ", 5000) + `"}],"user":"a","user":"b"}`
	_, err := tk.Estimate(tokens.Request{Format: tokens.FormatChat, ContentType: "application/json", Body: []byte(body), Fields: f}, 10)
	if !errors.Is(err, tokens.ErrInvalid) || !strings.Contains(err.Error(), `duplicate member "user"`) {
		t.Fatalf("duplicate past the cap: %v", err)
	}
}

func ExampleTokenizer_ReadFields() {
	tk := tokens.New()
	body := `{"model":"gpt-4o","Metadata":{"user_id":"ana"},"messages":[{"role":"user","content":"hi"}]}`
	model, v, err := tk.ReadFields(tokens.Request{
		ContentType: "application/json",
		Body:        []byte(body),
		Fields:      &tokens.Fields{JSON: []string{"metadata.user_id", "metadata.org"}},
	})
	fmt.Println(model, v.JSON, err)
	// Output: gpt-4o [{ana true} { false}] <nil>
}

// A top-level batch of requests: a path applies to each request; they
// must agree, or the body is refused (no one key could count the batch).
func TestJSONFieldsInABatch(t *testing.T) {
	const batch = `[{"user":"a","prompt":"x"},{"User":"a"},{"prompt":"y"}]`
	_, v, err := readFields("application/json", batch, &tokens.Fields{JSON: []string{"user"}})
	if err != nil || got(v.JSON)[0] != "a" {
		t.Fatalf("agreeing batch: %v %v", got(v.JSON), err)
	}
	// A path by index names one request.
	_, v, err = readFields("application/json", batch, &tokens.Fields{JSON: []string{"1.user"}})
	if err != nil || got(v.JSON)[0] != "a" {
		t.Fatalf("by index: %v %v", got(v.JSON), err)
	}
	_, v, err = readFields("application/json", `[{"user":"a"},{"user":"b"}]`, &tokens.Fields{JSON: []string{"user"}})
	if !errors.Is(err, tokens.ErrInvalid) {
		t.Fatalf("disagreeing batch: %v %v", got(v.JSON), err)
	}
}
