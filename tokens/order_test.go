package tokens_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"math/rand"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testpdf"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// node is a JSON value that keeps its members in document order, so that
// a body can be written back with its members in any order.
type node struct {
	keys []string // an object's member names; nil for an array or a scalar
	vals []*node  // an object's member values or an array's elements
	raw  string   // a scalar's JSON text
	arr  bool
}

func parseOrdered(t testing.TB, raw []byte) *node {
	t.Helper()
	raw = bytes.TrimSpace(raw)
	switch raw[0] {
	case '{':
		n := &node{keys: []string{}}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.Token()
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				t.Fatal(err)
			}
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				t.Fatal(err)
			}
			n.keys, n.vals = append(n.keys, k.(string)), append(n.vals, parseOrdered(t, v))
		}
		return n
	case '[':
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			t.Fatal(err)
		}
		n := &node{arr: true}
		for _, e := range elems {
			n.vals = append(n.vals, parseOrdered(t, e))
		}
		return n
	}
	return &node{raw: string(raw)}
}

// objects lists the objects of a tree in document order.
func (n *node) objects(out []*node) []*node {
	if n.keys != nil {
		out = append(out, n)
	}
	for _, v := range n.vals {
		out = v.objects(out)
	}
	return out
}

// write writes n with each object's members in the order order gives it
// (nil: document order).
func (n *node) write(b *strings.Builder, order map[*node][]int) {
	switch {
	case n.keys != nil:
		b.WriteByte('{')
		perm := order[n]
		for i := range n.keys {
			j := i
			if perm != nil {
				j = perm[i]
			}
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(q(n.keys[j]) + ":")
			n.vals[j].write(b, order)
		}
		b.WriteByte('}')
	case n.arr:
		b.WriteByte('[')
		for i, v := range n.vals {
			if i > 0 {
				b.WriteByte(',')
			}
			v.write(b, order)
		}
		b.WriteByte(']')
	default:
		b.WriteString(n.raw)
	}
}

func (n *node) String(order map[*node][]int) string {
	var b strings.Builder
	n.write(&b, order)
	return b.String()
}

// permutations returns every order of n members, or limit random ones
// when there are more.
func permutations(n, limit int, rng *rand.Rand) [][]int {
	fact := 1
	for i := 2; i <= n; i++ {
		fact *= i
	}
	if fact > limit {
		out := make([][]int, limit)
		for i := range out {
			out[i] = rng.Perm(n)
		}
		return out
	}
	var out [][]int
	var rec func(p []int, k int)
	rec = func(p []int, k int) {
		if k == len(p) {
			out = append(out, append([]int(nil), p...))
			return
		}
		for i := k; i < len(p); i++ {
			p[k], p[i] = p[i], p[k]
			rec(p, k+1)
			p[k], p[i] = p[i], p[k]
		}
	}
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	rec(p, 0)
	return out
}

type orderCase struct {
	name   string
	format tokens.Format
	body   string // canonical: model first, every type first
}

// orderCorpus holds requests of every API shape, written in the canonical
// order: model first, and type first in every part, block, item and
// source.
func orderCorpus(t testing.TB) []orderCase {
	img := pngDataURL(t, 1024, 512)
	png64 := strings.TrimPrefix(img, "data:image/png;base64,")
	pdf := base64.StdEncoding.EncodeToString(testpdf.OnePage("The quarterly report says revenue grew."))
	audio := base64.StdEncoding.EncodeToString(wav(3))
	text64 := b64("notes in a text file")
	return []orderCase{
		{"chat text and image parts", tokens.FormatChat, `{"model":"gpt-4o","messages":[{"role":"system","content":"be brief"},{"role":"user","name":"ann","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"` + img + `","detail":"low"}},{"type":"image_url","image_url":{"url":"https://example.com/cat.png"}}]}]}`},
		{"chat image_url string, detail beside it", tokens.FormatChat, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","detail":"low","image_url":"https://example.com/a.png"}]}]}`},
		{"chat audio and file parts", tokens.FormatChat, `{"model":"gpt-4o-audio-preview","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"` + audio + `","format":"wav"}},{"type":"file","file":{"filename":"a.txt","file_data":"` + text64 + `"}},{"type":"file","file":{"file_data":"data:application/pdf;base64,` + pdf + `","filename":"r.pdf"}},{"type":"file","file":{"file_id":"file-1"}}]}]}`},
		{"chat tools and response_format", tokens.FormatChat, `{"model":"gpt-4.1","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city.","parameters":{"type":"object","properties":{"city":{"type":"string","description":"The city."},"unit":{"type":"string","enum":["c","f"]}},"required":["city"]}}}],"response_format":{"type":"json_schema","json_schema":{"name":"r","schema":{"type":"object","properties":{"answer":{"type":"string"}}}}}}`},
		{"responses items", tokens.FormatResponses, `{"model":"gpt-4.1","instructions":"answer in French","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"describe"},{"type":"input_image","image_url":"` + img + `","detail":"high"},{"type":"input_image","file_id":"file-2"},{"type":"input_file","filename":"n.txt","file_data":"` + text64 + `"},{"type":"input_file","file_url":"https://example.com/a.pdf"}]},{"type":"function_call","call_id":"c1","name":"lookup","arguments":"{\"q\":\"x\"}"},{"type":"function_call_output","call_id":"c1","output":"found it"},{"type":"reasoning","id":"r1","summary":[{"type":"summary_text","text":"thinking about it"}]},{"type":"image_generation_call","id":"ig1","status":"completed","result":"` + png64 + `"}],"text":{"format":{"type":"json_schema","name":"r","schema":{"type":"object"}}},"tools":[{"type":"function","name":"lookup","description":"Look up.","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}]}`},
		{"anthropic remote image", tokens.FormatMessages, `{"model":"claude-sonnet-4","max_tokens":100,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://example.com/cat.png"}}]}]}`},
		{"anthropic blocks", tokens.FormatMessages, `{"model":"claude-sonnet-4","max_tokens":100,"system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + png64 + `"}},{"type":"image","source":{"type":"file","file_id":"file_1"}},{"type":"document","title":"report","context":"Q3","source":{"type":"base64","media_type":"application/pdf","data":"` + pdf + `"}},{"type":"document","source":{"type":"text","media_type":"text/plain","data":"` + text64 + `"}},{"type":"document","source":{"type":"content","content":[{"type":"text","text":"chunk one"}]}},{"type":"document","source":{"type":"url","url":"https://example.com/a.pdf"}},{"type":"text","text":"compare them"}]},{"role":"assistant","content":[{"type":"tool_use","id":"tu1","name":"search","input":{"query":"revenue","limit":3}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu1","content":[{"type":"search_result","source":"https://example.com/r","title":"Revenue","content":[{"type":"text","text":"grew 5%"}]},{"type":"image","source":{"type":"url","url":"https://example.com/chart.png"}}]}]}],"tools":[{"name":"search","description":"Search the web.","input_schema":{"type":"object","properties":{"query":{"type":"string"}}}}]}`},
		{"image detail in image_url and beside it", tokens.FormatChat, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","detail":"low","image_url":{"url":"https://example.com/a.png","detail":"high"}}]}]}`},
		{"anthropic source without a type", tokens.FormatMessages, `{"model":"claude-sonnet-4","messages":[{"role":"user","content":[{"type":"document","source":{"media_type":"text/plain","data":"` + text64 + `"}}]}]}`},
		{"anthropic JSON of mixed values", tokens.FormatMessages, `{"model":"claude-sonnet-4","messages":[{"role":"assistant","content":[{"type":"tool_use","id":"tu1","name":"f","input":{"n":12,"ok":true,"tags":["a","b"],"s":"text","none":null,"o":{"x":1.5}}}]}],"tools":[{"name":"f","description":"Do it.","input_schema":{"type":"object","required":["n"],"properties":{"n":{"type":"integer","minimum":0,"maximum":100},"ok":{"type":"boolean","default":false},"tags":{"type":"array","items":{"type":"string"}}},"additionalProperties":false}}]}`},
		{"api/chat JSON", tokens.FormatSeedChat, `{"model":"llama-3","message":"hello","system":"be kind","history":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}],"temperature":0.2}`},
		{"ollama chat", tokens.FormatGeneric, `{"model":"llama3","messages":[{"role":"user","content":"what is in this picture?","images":["` + png64 + `"]}],"format":{"type":"object","properties":{"a":{"type":"string"}}}}`},
	}
}

// orderEstimate counts body with limit, failing on an error.
func orderEstimate(t testing.TB, f tokens.Format, body string, limit int) tokens.Estimate {
	t.Helper()
	est, err := tk.Estimate(tokens.Request{Format: f, ContentType: "application/json", Body: []byte(body)}, limit)
	if err != nil {
		t.Fatalf("Estimate: %v\n%s", err, body)
	}
	return est
}

// checkOrder checks that body costs what the canonical body costs, and
// that the cap refuses it exactly when it refuses the canonical one.
func checkOrder(t testing.TB, f tokens.Format, body string, want int) {
	t.Helper()
	if got := orderEstimate(t, f, body, -1); got.Tokens != want {
		t.Fatalf("estimate %d, canonical order %d:\n%.600s", got.Tokens, want, body)
	}
	if est := orderEstimate(t, f, body, want); est.Stopped {
		t.Fatalf("refused at a cap of %d, which the canonical order is within: %+v\n%.600s", want, est, body)
	}
	if est := orderEstimate(t, f, body, want-1); !est.Stopped {
		t.Fatalf("admitted at a cap of %d: %+v\n%.600s", want-1, est, body)
	}
}

// An estimate does not depend on member order: every order of the
// members of each object, one object at a time, costs what the canonical
// order costs (a random sample of the orders of a large object).
func TestMemberOrder(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, c := range orderCorpus(t) {
		t.Run(c.name, func(t *testing.T) {
			tree := parseOrdered(t, []byte(c.body))
			want := orderEstimate(t, c.format, c.body, -1).Tokens
			for _, obj := range tree.objects(nil) {
				for _, perm := range permutations(len(obj.keys), 24, rng) {
					checkOrder(t, c.format, tree.String(map[*node][]int{obj: perm}), want)
				}
			}
		})
	}
}

// The case that was reported: a remote image written source first, as a
// client that sorts keys sends it, costs one image, not an image and a
// document page.
func TestMemberOrderSortedKeys(t *testing.T) {
	typeFirst := `{"model":"claude-sonnet-4","max_tokens":100,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://example.com/cat.png"}}]}]}`
	sorted := `{"max_tokens":100,"messages":[{"content":[{"source":{"type":"url","url":"https://example.com/cat.png"},"type":"image"}],"role":"user"}],"model":"claude-sonnet-4"}`
	want := orderEstimate(t, tokens.FormatMessages, typeFirst, -1).Tokens
	if want < 1600 || want > 1620 {
		t.Fatalf("type first: %d, want one image (1600) and the role", want)
	}
	checkOrder(t, tokens.FormatMessages, sorted, want)
}

// FuzzMemberOrder permutes the members of every object of a corpus
// request at once, at random: the estimate never changes.
func FuzzMemberOrder(f *testing.F) {
	for seed := range int64(40) {
		f.Add(seed)
	}
	corpus := orderCorpus(f)
	trees := make([]*node, len(corpus))
	wants := make([]int, len(corpus))
	for i, c := range corpus {
		trees[i] = parseOrdered(f, []byte(c.body))
		wants[i] = orderEstimate(f, c.format, c.body, -1).Tokens
	}
	f.Fuzz(func(t *testing.T, seed int64) {
		rng := rand.New(rand.NewSource(seed))
		i := rng.Intn(len(corpus))
		order := map[*node][]int{}
		for _, obj := range trees[i].objects(nil) {
			order[obj] = rng.Perm(len(obj.keys))
		}
		checkOrder(t, corpus[i].format, trees[i].String(order), wants[i])
	})
}
