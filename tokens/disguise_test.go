package tokens_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testpdf"
	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// q is s as a JSON string.
func q(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// A disguise dresses a prompt in one of the shapes an upstream reads.
type disguise struct {
	name   string
	format tokens.Format
	ct     string // content type; JSON when empty
	body   func(text string) string
}

// disguises are the shapes SPEC §4.6 names, and the tricks tried against
// the first release: each must cost what its text costs.
var disguises = []disguise{
	{"chat content string", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","content":` + q(x) + `}]}`
	}},
	{"chat refusal part", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","messages":[{"role":"assistant","content":[{"type":"refusal","refusal":` + q(x) + `}]}]}`
	}},
	{"chat part of a type not invented yet", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"hologram","caption":{"words":` + q(x) + `}}]}]}`
	}},
	{"chat content as one object", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","content":{"type":"text","text":` + q(x) + `}}]}`
	}},
	{"chat file part, text data URL", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.txt","file_data":"data:text/plain;base64,` + b64(x) + `"}}]}]}`
	}},
	{"chat file part, bare base64 text file", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_data":"` + b64(x) + `","filename":"notes.md"}}]}]}`
	}},
	{"chat message name", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","name":` + q(x) + `,"content":"hi"}]}`
	}},
	{"chat tool call arguments", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","messages":[{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":` + q(x) + `}}]}]}`
	}},
	{"chat reasoning content", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","messages":[{"role":"assistant","reasoning_content":` + q(x) + `}]}`
	}},
	{"response_format schema", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"r","schema":{"type":"object","properties":{"a":{"type":"string","description":` + q(x) + `}}}}}}`
	}},
	{"tools, nested property description", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"string","description":` + q(x) + `}}}}}}}]}`
	}},
	{"tools, property name", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{` + q(x) + `:{"type":"string"}}}}}]}`
	}},
	{"legacy suffix", tokens.FormatCompletions, "", func(x string) string {
		return `{"model":"gpt-3.5-turbo-instruct","prompt":"a","suffix":` + q(x) + `}`
	}},
	{"prompt batch", tokens.FormatCompletions, "", func(x string) string {
		return `{"model":"gpt-3.5-turbo-instruct","prompt":["a",` + q(x) + `]}`
	}},
	{"embeddings input", tokens.FormatEmbeddings, "", func(x string) string {
		return `{"model":"text-embedding-3-small","input":[` + q(x) + `]}`
	}},
	{"responses instructions", tokens.FormatResponses, "", func(x string) string {
		return `{"model":"gpt-4.1","instructions":` + q(x) + `,"input":"hi"}`
	}},
	{"responses output_text item", tokens.FormatResponses, "", func(x string) string {
		return `{"model":"gpt-4.1","input":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":` + q(x) + `,"annotations":[]}]}]}`
	}},
	{"responses function call output", tokens.FormatResponses, "", func(x string) string {
		return `{"model":"gpt-4.1","input":[{"type":"function_call_output","call_id":"c","output":` + q(x) + `}]}`
	}},
	{"responses reasoning summary", tokens.FormatResponses, "", func(x string) string {
		return `{"model":"gpt-4.1","input":[{"type":"reasoning","id":"r","summary":[{"type":"summary_text","text":` + q(x) + `}]}]}`
	}},
	{"responses input_file", tokens.FormatResponses, "", func(x string) string {
		return `{"model":"gpt-4.1","input":[{"role":"user","content":[{"type":"input_file","filename":"a.txt","file_data":"data:text/plain;base64,` + b64(x) + `"}]}]}`
	}},
	{"responses text.format schema", tokens.FormatResponses, "", func(x string) string {
		return `{"model":"gpt-4.1","input":"hi","text":{"format":{"type":"json_schema","name":"x","schema":{"properties":{"a":{"description":` + q(x) + `}}}}}}`
	}},
	{"anthropic document, text source", tokens.FormatMessages, "", func(x string) string {
		return `{"model":"claude-sonnet-4","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":` + q(x) + `}}]}]}`
	}},
	{"anthropic document, content source", tokens.FormatMessages, "", func(x string) string {
		return `{"model":"claude-sonnet-4","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"content","content":[{"type":"text","text":` + q(x) + `}]}}]}]}`
	}},
	{"anthropic document, base64 text", tokens.FormatMessages, "", func(x string) string {
		return `{"model":"claude-sonnet-4","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document","source":{"data":"` + b64(x) + `","type":"base64","media_type":"text/plain"}}]}]}`
	}},
	{"anthropic document title", tokens.FormatMessages, "", func(x string) string {
		return `{"model":"claude-sonnet-4","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document","title":` + q(x) + `,"source":{"type":"text","media_type":"text/plain","data":"a"}}]}]}`
	}},
	{"anthropic document context", tokens.FormatMessages, "", func(x string) string {
		return `{"model":"claude-sonnet-4","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document","context":` + q(x) + `,"source":{"type":"text","media_type":"text/plain","data":"a"}}]}]}`
	}},
	{"anthropic tool_use input", tokens.FormatMessages, "", func(x string) string {
		return `{"model":"claude-sonnet-4","max_tokens":10,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"q":` + q(x) + `}}]}]}`
	}},
	{"anthropic tool_result", tokens.FormatMessages, "", func(x string) string {
		return `{"model":"claude-sonnet-4","max_tokens":10,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":` + q(x) + `}]}]}]}`
	}},
	{"anthropic search_result", tokens.FormatMessages, "", func(x string) string {
		return `{"model":"claude-sonnet-4","max_tokens":10,"messages":[{"role":"user","content":[{"type":"search_result","source":"https://x","title":"t","content":[{"type":"text","text":` + q(x) + `}]}]}]}`
	}},
	{"anthropic tools input_schema", tokens.FormatMessages, "", func(x string) string {
		return `{"model":"claude-sonnet-4","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"f","input_schema":{"type":"object","properties":{"a":{"description":` + q(x) + `}}}}]}`
	}},
	{"/api/chat history", tokens.FormatSeedChat, "", func(x string) string {
		return `{"message":"hi","history":[{"role":"user","content":` + q(x) + `}]}`
	}},
	{"member name case: Messages", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","Messages":[{"role":"user","content":` + q(x) + `}]}`
	}},
	{"member name case: MESSAGES", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","MESSAGES":[{"role":"user","content":` + q(x) + `}]}`
	}},
	{"member name folding: meſſages", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","meſſages":[{"role":"user","content":` + q(x) + `}]}`
	}},
	{"member name escaped", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","\u006d\u0065ssages":[{"role":"user","CONTENT":` + q(x) + `}]}`
	}},
	{"member name case: Prompt", tokens.FormatCompletions, "", func(x string) string {
		return `{"model":"gpt-3.5-turbo-instruct","Prompt":` + q(x) + `}`
	}},
	{"member name case: Input", tokens.FormatEmbeddings, "", func(x string) string {
		return `{"model":"text-embedding-3-small","Input":` + q(x) + `}`
	}},
	{"second copy of messages", tokens.FormatChat, "", func(x string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"messages":[{"role":"user","content":` + q(x) + `}]}`
	}},
	{"a batch of requests", tokens.FormatChat, "", func(x string) string {
		return `[{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]},{"model":"gpt-4o","messages":[{"role":"user","content":` + q(x) + `}]}]`
	}},
	{"other provider's model", tokens.FormatChat, "", func(x string) string {
		return `{"model":"llama-3.1-70b","messages":[{"role":"user","content":` + q(x) + `}]}`
	}},
	{"multipart field of any name", tokens.FormatSeedChat, "multipart", func(x string) string {
		return x
	}},
	{"url-encoded form field of any name", tokens.FormatSeedChat, "application/x-www-form-urlencoded", func(x string) string {
		return "message=hi&context=" + url.QueryEscape(x)
	}},
	{"JSON sent as text/plain", tokens.FormatChat, "text/plain", func(x string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","content":` + q(x) + `}]}`
	}},
}

// Every disguise of a prompt far over the cap is over the cap, and the
// same disguise of a small prompt stays small.
func TestDisguises(t *testing.T) {
	const limit = 2000
	big := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 1000) // ~10k tokens
	for _, d := range disguises {
		t.Run(d.name, func(t *testing.T) {
			for _, c := range []struct {
				text string
				over bool
			}{{big, true}, {"Hello there", false}} {
				body, ct := d.body(c.text), d.ct
				switch ct {
				case "":
					ct = "application/json"
				case "multipart":
					body, ct = multipartBody(t, map[string]string{"message": "hi", "context_notes": body})
				}
				est, err := tk.Estimate(tokens.Request{Format: d.format, ContentType: ct, Body: []byte(body)}, limit)
				if err != nil {
					t.Fatalf("over=%v: %v", c.over, err)
				}
				if c.over != (est.Tokens > limit) || !c.over && est.Tokens > 200 {
					t.Fatalf("over=%v: estimated %+v", c.over, est)
				}
			}
		})
	}
}

// Text the model reads as many tokens as it has characters, or more,
// is not priced at ¼ token per byte for models of other providers.
func TestOtherProvidersNeverBelowBPE(t *testing.T) {
	for _, text := range []string{strings.Repeat("😀", 6900), strings.Repeat("𒀀", 6900)} {
		body := `{"model":"llama-3","messages":[{"role":"user","content":` + q(text) + `}]}`
		est := estimate(t, tokens.FormatChat, "application/json", body, -1)
		if est.Tokens < 6900 || est.Encoding != tokens.Heuristic {
			t.Errorf("%.8q…: %+v", text, est)
		}
	}
	// Prose never below the seed's characters ÷ 3.5.
	body := `{"model":"claude-sonnet-4","messages":[{"role":"user","content":"` + strings.Repeat("a", 3500) + `"}]}`
	if est := estimate(t, tokens.FormatMessages, "application/json", body, -1); est.Tokens < 1000 {
		t.Errorf("a run of letters: %+v", est)
	}
}

// A member the proxy decides on, repeated in any spelling, is refused: the
// proxy cannot know which copy the upstream reads.
func TestDuplicateDecidedMembers(t *testing.T) {
	for _, body := range []string{
		`{"model":"llama-3","messages":[],"model":"gpt-4"}`,
		`{"model":"llama-3","Model":"gpt-4"}`,
		`{"MODEL":"a","mode\u006c":"b"}`,
		`{"stream":false,"stream":true}`,
		`{"max_tokens":1,"MAX_TOKENS":100000}`,
		`{"max_completion_tokens":1,"max_completion_tokens":2}`,
		`{"max_output_tokens":1,"Max_Output_Tokens":2}`,
	} {
		_, err := tk.Estimate(tokens.Request{Format: tokens.FormatChat, ContentType: "application/json", Body: []byte(body)}, -1)
		if !errors.Is(err, tokens.ErrInvalid) || !strings.Contains(err.Error(), "duplicate member") {
			t.Errorf("%s: %v", body, err)
		}
	}
	// Once each, in nested objects, or as text members: fine.
	for _, body := range []string{
		`{"model":"gpt-4o","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi","model":"x"}]}`,
		`{"messages":[],"messages":[]}`,
	} {
		if _, err := tk.Estimate(tokens.Request{Format: tokens.FormatChat, ContentType: "application/json", Body: []byte(body)}, -1); err != nil {
			t.Errorf("%s: %v", body, err)
		}
	}
}

// The model is read in any spelling of its member name.
func TestModelMemberFolded(t *testing.T) {
	est := estimate(t, tokens.FormatChat, "application/json", `{"messages":[],"MoDeL":"gpt-4"}`, -1)
	if est.Model != "gpt-4" || est.Encoding != tokens.CL100KBase {
		t.Fatalf("got %+v", est)
	}
}

// Bodies that are not one UTF-8 JSON document are refused, not misread.
func TestNotUTF8JSON(t *testing.T) {
	utf16 := func(s string) string {
		var b strings.Builder
		for _, c := range s {
			b.WriteByte(byte(c))
			b.WriteByte(0)
		}
		return b.String()
	}
	for name, c := range map[string][2]string{
		"BOM, JSON type":        {"application/json", "\xef\xbb\xbf{\"prompt\":\"x\"}"},
		"BOM, no type":          {"", "\xef\xbb\xbf{\"prompt\":\"x\"}"},
		"UTF-16LE with BOM":     {"", "\xff\xfe" + utf16(`{"prompt":"x"}`)},
		"UTF-16LE without BOM":  {"text/plain", utf16(`{"prompt":"x"}`)},
		"UTF-16, JSON type":     {"application/json", "\xff\xfe" + utf16(`{"prompt":"x"}`)},
		"invalid UTF-8":         {"application/json", "{\"prompt\":\"a\xffb\"}"},
		"invalid UTF-8 in name": {"application/json", "{\"pr\xc3\":\"a\"}"},
		"overlong UTF-8":        {"application/json", "{\"prompt\":\"\xc0\xaf\"}"},
		"surrogate as UTF-8":    {"application/json", "{\"prompt\":\"\xed\xa0\x80\"}"},
		"second document":       {"application/json", `{"prompt":"a"}{"prompt":"b"}`},
	} {
		_, err := tk.Estimate(tokens.Request{Format: tokens.FormatCompletions, ContentType: c[0], Body: []byte(c[1])}, -1)
		if !errors.Is(err, tokens.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Valid UTF-8 of every length, cut anywhere by the reader's buffers.
	text := strings.Repeat("aé€😀", 20000)
	body := `{"model":"gpt-4o","prompt":` + q(text) + `}`
	if est := estimate(t, tokens.FormatCompletions, "application/json", body, -1); est.Tokens != n(t, "gpt-4o", text) {
		t.Fatalf("got %+v, want %d", est, n(t, "gpt-4o", text))
	}
}

// Metadata is not text: ids, types, media types and signatures cost
// nothing, so an honest request is not overcharged.
func TestMetadataIsNotText(t *testing.T) {
	const m = "gpt-4o"
	long := strings.Repeat("x", 5000)
	body := fmt.Sprintf(`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"hi","id":%q,"cache_control":{"type":"ephemeral"}}],"tool_call_id":%q}]}`, long, long)
	if got, want := estimate(t, tokens.FormatChat, "application/json", body, -1).Tokens, 3+n(t, m, "user")+n(t, m, "hi")+3; got != want {
		t.Fatalf("got %d, want %d", got, want)
	}
}

// wav is a PCM WAV of the given length: 8 kHz, 8-bit, mono.
func wav(seconds int) []byte {
	const rate = 8000
	n := rate * seconds
	b := make([]byte, 44+n)
	copy(b, "RIFF")
	le32 := func(at int, v uint32) {
		b[at], b[at+1], b[at+2], b[at+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	}
	le32(4, uint32(36+n))
	copy(b[8:], "WAVEfmt ")
	le32(16, 16)
	b[20], b[22] = 1, 1 // PCM, mono
	le32(24, rate)
	le32(28, rate) // byte rate
	b[32], b[34] = 1, 8
	copy(b[36:], "data")
	le32(40, uint32(n))
	for i := 44; i < len(b); i++ {
		b[i] = 128
	}
	return b
}

// mp3 is an MP3 a little longer than the given seconds: MPEG-1 layer III
// frames of 128 kbit/s at 44.1 kHz (417 bytes, 26.1 ms each).
func mp3(seconds int) []byte {
	frame := make([]byte, 417)
	copy(frame, "\xff\xfb\x90\xc4")
	return bytes.Repeat(frame, seconds*44100/1152+1)
}

// Audio costs its duration: a long recording is over the cap in every
// dress, a short one is not. The samples of a WAV file can be any bytes:
// they cost the higher of their sound and the text runs they hold.
func TestAudioDuration(t *testing.T) {
	const limit = 2000
	for name, body := range map[string]func(string) string{
		"input_audio": func(d string) string {
			return `{"model":"gpt-4o-audio-preview","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"` + d + `","format":"wav"}}]}]}`
		},
		"input_audio, format lies": func(d string) string {
			return `{"model":"gpt-4o-audio-preview","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"format":"flac","data":"` + d + `"}}]}]}`
		},
		"file part, audio data URL": func(d string) string {
			return `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_data":"data:audio/wav;base64,` + d + `"}}]}]}`
		},
	} {
		for _, long := range [][]byte{wav(250), mp3(250)} {
			if est := estimate(t, tokens.FormatChat, "application/json", body(base64.StdEncoding.EncodeToString(long)), limit); est.Tokens <= limit {
				t.Errorf("%s: 250 s: %+v", name, est)
			}
		}
		under := estimate(t, tokens.FormatChat, "application/json", body(base64.StdEncoding.EncodeToString(mp3(2))), limit)
		if under.Tokens < 21 || under.Tokens > 100 {
			t.Errorf("%s: 2 s MP3: %+v", name, under)
		}
		if est := estimate(t, tokens.FormatChat, "application/json", body(base64.StdEncoding.EncodeToString(wav(1))), -1); est.Tokens > 100 {
			t.Errorf("%s: 1 s WAV: %+v", name, est)
		}
		// Samples that are prose cost the prose.
		prosy := wav(1)
		prose := strings.Repeat("Summarise the attached minutes of the board meeting. ", 160)[:len(prosy)-44]
		copy(prosy[44:], prose)
		if est, want := estimate(t, tokens.FormatChat, "application/json", body(base64.StdEncoding.EncodeToString(prosy)), -1), n(t, "gpt-4o", prose); est.Tokens < want {
			t.Errorf("%s: 1 s WAV of prose: %+v, the prose: %d", name, est, want)
		}
	}
	// Uploaded, too.
	for _, long := range [][]byte{wav(250), mp3(250)} {
		mp, ct := multipartBody(t, map[string]string{"message": "transcribe"}, [3]string{"a.wav", "audio/wav", string(long)})
		if est := estimate(t, tokens.FormatSeedChat, ct, mp, limit); est.Tokens <= limit {
			t.Errorf("uploaded 250 s: %+v", est)
		}
	}
	mp, ct := multipartBody(t, map[string]string{"message": "transcribe"}, [3]string{"a.mp3", "audio/mpeg", string(mp3(2))})
	if est := estimate(t, tokens.FormatSeedChat, ct, mp, limit); est.Tokens > 100 {
		t.Errorf("uploaded 2 s MP3: %+v", est)
	}
}

// A text file that starts with an audio format's signature is text: the
// prose after the signature costs at least what it costs as text, as a
// data URL and as an upload.
func TestAudioSignatureThenProse(t *testing.T) {
	var prose strings.Builder
	for i := 0; prose.Len() < 95<<10; i++ {
		fmt.Fprintf(&prose, "Paragraph %d: the quick brown fox jumps over the lazy dog %d times.\n", i, i*7%13)
	}
	want := n(t, "gpt-4o", prose.String())
	for _, sig := range []string{"ID3", "ID3\x04\x00\x00", "RIFF", "RIFF\x00\x00\x00\x00WAVE", "OggS", "fLaC", "\x1aE\xdf\xa3",
		"\x00\x00\x00\x18ftypM4A \x00\x00\x02\x00isomiso2", "\xff\xfb\x90\xc4"} {
		file := sig + prose.String()
		data := `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_data":"data:audio/mpeg;base64,` +
			base64.StdEncoding.EncodeToString([]byte(file)) + `"}}]}]}`
		if est := estimate(t, tokens.FormatChat, "application/json", data, -1); est.Tokens < want {
			t.Errorf("%q then prose, as a data URL: %d tokens, the prose alone %d", sig, est.Tokens, want)
		}
		mp, ct := multipartBody(t, map[string]string{"message": "x"}, [3]string{"a.mp3", "audio/mpeg", file})
		if est := estimate(t, tokens.FormatSeedChat, ct, mp, -1); est.Tokens < want {
			t.Errorf("%q then prose, uploaded: %d tokens, the prose alone %d", sig, est.Tokens, want)
		}
	}
}

// A PDF costs its text and its pages, in every dress, not its size.
func TestPDFCostsItsText(t *testing.T) {
	const limit = 2000
	var words strings.Builder
	for i := 0; words.Len() < 80<<10; i++ {
		fmt.Fprintf(&words, "clause %d of the agreement binds party %d to deliver item %d\n", i, i%7, i*31%1000)
	}
	bomb, small := testpdf.OnePage(words.String()), testpdf.OnePage("Invoice 42: total due 100 EUR.")
	if len(bomb) > 16<<10 {
		t.Fatalf("the test PDF is %d bytes: not the small compressed file it should be", len(bomb))
	}
	for name, body := range map[string]func([]byte) (tokens.Format, string){
		"openai file part": func(p []byte) (tokens.Format, string) {
			return tokens.FormatChat, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,` + base64.StdEncoding.EncodeToString(p) + `"}}]}]}`
		},
		"responses input_file": func(p []byte) (tokens.Format, string) {
			return tokens.FormatResponses, `{"model":"gpt-4.1","input":[{"role":"user","content":[{"type":"input_file","filename":"a.pdf","file_data":"data:application/pdf;base64,` + base64.StdEncoding.EncodeToString(p) + `"}]}]}`
		},
		"anthropic document, media type after data": func(p []byte) (tokens.Format, string) {
			return tokens.FormatMessages, `{"model":"claude-sonnet-4","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"data":"` + base64.StdEncoding.EncodeToString(p) + `","type":"base64","media_type":"application/pdf"}}]}]}`
		},
		"anthropic document, no media type": func(p []byte) (tokens.Format, string) {
			return tokens.FormatMessages, `{"model":"claude-sonnet-4","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","data":"` + base64.StdEncoding.EncodeToString(p) + `"}}]}]}`
		},
	} {
		f, over := body(bomb)
		_, under := body(small)
		if est := estimate(t, f, "application/json", over, limit); est.Tokens <= limit {
			t.Errorf("%s: %d-byte PDF of 80 KB text: %+v", name, len(bomb), est)
		}
		if est := estimate(t, f, "application/json", under, limit); est.Tokens > limit {
			t.Errorf("%s: a one-line PDF: %+v", name, est)
		}
	}
	mp, ct := multipartBody(t, map[string]string{"message": "summarise"}, [3]string{"contract.pdf", "application/pdf", string(bomb)})
	if est := estimate(t, tokens.FormatSeedChat, ct, mp, limit); est.Tokens <= limit {
		t.Errorf("uploaded: %+v", est)
	}
	mp, ct = multipartBody(t, map[string]string{"message": "summarise"}, [3]string{"contract.bin", "application/octet-stream", string(bomb)})
	if est := estimate(t, tokens.FormatSeedChat, ct, mp, limit); est.Tokens <= limit {
		t.Errorf("uploaded as octet-stream: %+v", est)
	}
	// The page and its text, exactly: 765 a page on OpenAI's shapes.
	f, under := func() (tokens.Format, string) {
		return tokens.FormatChat, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_data":"data:application/pdf;base64,` + base64.StdEncoding.EncodeToString(small) + `"}}]}]}`
	}()
	if got, want := estimate(t, f, "application/json", under, -1).Tokens, 3+n(t, "gpt-4o", "user")+n(t, "gpt-4o", "Invoice 42: total due 100 EUR.")+765+3; got < want || got > want+2 {
		t.Errorf("one-line PDF: %d tokens, want %d (+ a line break or two)", got, want)
	}
}

// The review's findings: each dress below reached the upstream with a
// prompt 10–36 times over the cap before it was fixed.
func TestDisguisesFromReview(t *testing.T) {
	const limit = 2000
	var words strings.Builder
	for i := 0; words.Len() < 80<<10; i++ {
		fmt.Fprintf(&words, "clause %d of the agreement binds party %d to deliver item %d\n", i, i%7, i*31%1000)
	}
	big := words.String()
	pdf := base64.StdEncoding.EncodeToString(testpdf.OnePage(big))
	junk := func(s string) string { // a '!' every 40 characters: Python's and Node's decoders skip it
		var b strings.Builder
		for i := 0; i < len(s); i += 40 {
			b.WriteString(s[i:min(i+40, len(s))])
			b.WriteByte('!')
		}
		return b.String()
	}
	chatFile := func(fileData string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_data":` + q(fileData) + `}}]}]}`
	}
	type dress struct {
		name, ct string
		format   tokens.Format
		body     string
	}
	mpRaw := func(disposition, ctype, content string) (string, string) {
		body := "--b\r\nContent-Disposition: form-data; name=\"message\"\r\n\r\nsummarise\r\n" +
			"--b\r\nContent-Disposition: " + disposition + "\r\n"
		if ctype != "" {
			body += "Content-Type: " + ctype + "\r\n"
		}
		return body + "\r\n" + content + "\r\n--b--\r\n", "multipart/form-data; boundary=b"
	}
	utf16 := func(s string) string {
		var b strings.Builder
		b.WriteString("\xff\xfe")
		for _, c := range s {
			b.WriteByte(byte(c))
			b.WriteByte(0)
		}
		return b.String()
	}
	var dresses []dress
	for _, prefix := range []string{"DATA:application/pdf;base64,", "data:application/pdf; base64,", "data:application/pdf;base64 ,",
		"data:application/pdf;base64;x=y,", " data:application/pdf;base64,", "data:text/plain;base64,"} {
		dresses = append(dresses, dress{"data URL " + q(prefix), "", tokens.FormatChat, chatFile(prefix + pdf)})
	}
	dresses = append(dresses,
		dress{"junk in declared base64", "", tokens.FormatChat, chatFile("data:application/pdf;base64," + junk(pdf))},
		dress{"junk in an Anthropic base64 source", "", tokens.FormatMessages,
			`{"model":"claude-sonnet-4","messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":` + q(junk(pdf)) + `}}]}]}`},
		dress{"form that is also JSON", "application/x-www-form-urlencoded", tokens.FormatSeedChat,
			`{"x":"&message=` + url.QueryEscape(big) + `&"}`},
		dress{"/api/chat unknown member", "", tokens.FormatSeedChat, `{"message":"x","context":` + q(big) + `}`},
		dress{"/api/chat attachments", "", tokens.FormatSeedChat, `{"message":"x","attachments":[{"content":` + q(big) + `}]}`},
		dress{"tools type value", "", tokens.FormatChat,
			`{"model":"gpt-4o","messages":[],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":` + q(big) + `}}}]}`},
		dress{"form model of another provider", "application/x-www-form-urlencoded", tokens.FormatSeedChat,
			"model=llama-3&message=" + url.QueryEscape(strings.Repeat(" ", 7200))},
		dress{"remote documents", "", tokens.FormatMessages,
			`{"model":"claude-sonnet-4","messages":[{"role":"user","content":[` + strings.Repeat(`{"type":"document","source":{"type":"url","url":"https://x/a.pdf"}},`, 19) +
				`{"type":"document","source":{"type":"url","url":"https://x/a.pdf"}}]}]}`},
	)
	for _, c := range []struct{ name, disp, ctype, content string }{
		{"unquoted filename with a space", `form-data; name="file"; filename=a b.pdf`, "application/pdf", string(testpdf.OnePage(big))},
		{"UTF-16 text file, no type", `form-data; name="file"; filename="a.txt"`, "", utf16(big)},
		{"text labelled image/png", `form-data; name="file"; filename="a.png"`, "image/png", big},
		{"text labelled audio/wav", `form-data; name="file"; filename="a.wav"`, "audio/wav", big},
	} {
		body, ct := mpRaw(c.disp, c.ctype, c.content)
		dresses = append(dresses, dress{"multipart: " + c.name, ct, tokens.FormatSeedChat, body})
	}
	for _, d := range dresses {
		ct := d.ct
		if ct == "" {
			ct = "application/json"
		}
		est, err := tk.Estimate(tokens.Request{Format: d.format, ContentType: ct, Body: []byte(d.body)}, limit)
		if err != nil || est.Tokens <= limit {
			t.Errorf("%s: %+v %v", d.name, est, err)
		}
	}
	// Two model fields in a form or a multipart body are refused, as in JSON.
	for _, c := range [][2]string{
		{"application/x-www-form-urlencoded", "model=gpt-4o&message=hi&model=llama-3"},
		{"multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ngpt-4o\r\n--b\r\nContent-Disposition: form-data; name=\"Model\"\r\n\r\nllama-3\r\n--b--\r\n"},
		{"text/plain", `{"model":"gpt-4o","model":"llama-3","prompt":"hi"}`},
	} {
		_, err := tk.Estimate(tokens.Request{Format: tokens.FormatSeedChat, ContentType: c[0], Body: []byte(c[1])}, limit)
		if !errors.Is(err, tokens.ErrInvalid) || !strings.Contains(err.Error(), `duplicate member "model"`) {
			t.Errorf("%s: %v", c[0], err)
		}
	}
	// A replayed generated image costs an image, not its base64 as text.
	png := noisePNG(t, 300, 300) // ~270 KB
	body := `{"model":"gpt-4.1","input":[{"type":"image_generation_call","id":"ig_1","status":"completed","result":"` + base64.StdEncoding.EncodeToString(png) + `"},{"role":"user","content":"thanks"}]}`
	if est := estimate(t, tokens.FormatResponses, "application/json", body, limit); est.Tokens > limit {
		t.Errorf("a replayed generated image: %+v", est)
	}
}
