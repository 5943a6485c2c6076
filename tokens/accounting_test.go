package tokens_test

import (
	"encoding/base64"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testpdf"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// The accounting property, in every file slot of every API: prose put
// anywhere in or around a real file of any kind (before it, after it,
// inside it, alone) is never cheaper than the prose itself, because the
// only bytes a reader may leave uncosted are those of a structure it
// checked, and prose is none.

// accountingFiles are real small files of each kind the readers know.
func accountingFiles(t testing.TB) map[string][]byte {
	return map[string][]byte{
		"png":  encoded(t, "png", 64, 48),
		"jpeg": encoded(t, "jpeg", 64, 48),
		"gif":  encoded(t, "gif", 64, 48),
		"pdf":  testpdf.OnePage("Quarterly figures"),
		"mp3":  mp3(1),
		"wav":  wav(1),
		"none": nil,
	}
}

// slots are the places a file can be sent, with the media type and name
// said of it.
var accountingSlots = []struct {
	name string
	f    tokens.Format
	body func(b64, mediaType, filename string) string
}{
	{"chat image_url", tokens.FormatChat, func(b, mt, _ string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:` + mt + `;base64,` + b + `"}}]}]}`
	}},
	{"chat file", tokens.FormatChat, func(b, mt, fn string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"` + fn + `","file_data":"data:` + mt + `;base64,` + b + `"}}]}]}`
	}},
	{"chat input_audio", tokens.FormatChat, func(b, _, _ string) string {
		return `{"model":"gpt-4o-audio-preview","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"` + b + `","format":"wav"}}]}]}`
	}},
	{"responses input_image", tokens.FormatResponses, func(b, mt, _ string) string {
		return `{"model":"gpt-4o","input":[{"role":"user","content":[{"type":"input_image","image_url":"data:` + mt + `;base64,` + b + `"}]}]}`
	}},
	{"responses input_file", tokens.FormatResponses, func(b, mt, fn string) string {
		return `{"model":"gpt-4o","input":[{"role":"user","content":[{"type":"input_file","filename":"` + fn + `","file_data":"data:` + mt + `;base64,` + b + `"}]}]}`
	}},
	{"anthropic image", tokens.FormatMessages, func(b, mt, _ string) string {
		return `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"` + mt + `","data":"` + b + `"}}]}]}`
	}},
	{"anthropic document", tokens.FormatMessages, func(b, mt, _ string) string {
		return `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"` + mt + `","data":"` + b + `"}}]}]}`
	}},
}

var accountingTypes = [][2]string{
	{"image/png", "a.png"}, {"image/jpeg", "a.jpg"}, {"application/pdf", "a.pdf"}, {"audio/wav", "a.wav"},
	{"audio/mpeg", "a.mp3"}, {"text/plain", "a.txt"}, {"application/octet-stream", "a.bin"},
}

// place puts prose into file: 0 before it, 1 after it, 2 at a random
// offset inside it.
func place(file []byte, prose string, where int, r *rand.Rand) []byte {
	switch {
	case where == 0 || len(file) == 0:
		return append([]byte(prose), file...)
	case where == 1:
		return append(append([]byte{}, file...), prose...)
	}
	at := 1 + r.IntN(len(file)-1)
	out := append([]byte{}, file[:at]...)
	out = append(out, prose...)
	return append(out, file[at:]...)
}

func checkAccounting(t *testing.T, files map[string][]byte, kind string, where, slot, typ int, r *rand.Rand) {
	prose := strings.Repeat("Every board member must read the attached minutes before Friday. ", 60)
	want := n(t, "gpt-4o", prose) * 9 / 10
	data := place(files[kind], prose, where, r)
	s := accountingSlots[slot]
	ty := accountingTypes[typ]
	body := s.body(base64.StdEncoding.EncodeToString(data), ty[0], ty[1])
	est, err := tk.Estimate(tokens.Request{Format: s.f, ContentType: "application/json", Body: []byte(body)}, -1)
	if err != nil {
		t.Fatalf("%s, prose %d, in %s as %s: %v", kind, where, s.name, ty[0], err)
	}
	if est.Tokens < want {
		t.Errorf("%s with prose placed %d, in %s as %s %s: %d tokens, the prose alone %d", kind, where, s.name, ty[0], ty[1], est.Tokens, want)
	}
	if typ == 0 { // and uploaded
		mp, ct := multipartFile(t, ty[1], ty[0], data)
		if got := estimateCT(t, tokens.FormatSeedChat, ct, mp); got < want {
			t.Errorf("%s with prose placed %d, uploaded as %s: %d tokens, the prose alone %d", kind, where, ty[0], got, want)
		}
	}
}

func TestAccountingProperty(t *testing.T) {
	files := accountingFiles(t)
	r := rand.New(rand.NewPCG(7, 11))
	for kind := range files {
		for where := range 3 {
			for slot := range accountingSlots {
				for typ := range accountingTypes {
					checkAccounting(t, files, kind, where, slot, typ, r)
				}
			}
		}
	}
}

func FuzzAccounting(f *testing.F) {
	f.Add(uint8(0), uint8(2), uint8(0), uint8(0), uint64(1))
	f.Fuzz(func(t *testing.T, kind, where, slot, typ uint8, seed uint64) {
		files := accountingFiles(t)
		kinds := []string{"png", "jpeg", "gif", "pdf", "mp3", "wav", "none"}
		checkAccounting(t, files, kinds[int(kind)%len(kinds)], int(where)%3, int(slot)%len(accountingSlots),
			int(typ)%len(accountingTypes), rand.New(rand.NewPCG(seed, seed^0x9e37)))
	})
}
