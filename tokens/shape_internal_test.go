package tokens

import (
	"encoding/json"
	"testing"
)

func TestFold(t *testing.T) {
	for in, want := range map[string]string{
		"messages": "messages", "Messages": "messages", "MESSAGES": "messages", "meſſages": "messages",
		"MEſſAGES": "messages", "\u212aey": "key", "model": "model", "MODEL": "model", "max_Tokens": "max_tokens",
		"Straße": "straße", "ΣΑΣ": "σασ", "": "",
	} {
		if got := string(fold([]byte(in), nil)); got != want && string(fold([]byte(want), nil)) != got {
			t.Errorf("fold(%q) = %q, want the fold of %q", in, got, want)
		}
	}
	if string(fold([]byte("ΣΑΣ"), nil)) != string(fold([]byte("σας"), nil)) {
		t.Error("final sigma does not fold with capital sigma")
	}
}

// FuzzFoldMatchesEncodingJSON: every member name that Go's encoding/json
// (Ollama, LocalAI) reads as one of the members the counter looks for
// folds to that member's name, so no spelling reaches the upstream unread.
func FuzzFoldMatchesEncodingJSON(f *testing.F) {
	for _, s := range []string{"messages", "Messages", "meſſages", "MODEL", "prompt", "\u212a", "max_tokens", "ınput"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		key, err := json.Marshal(name)
		if err != nil {
			return
		}
		var v struct {
			Messages  *int `json:"messages"`
			Model     *int `json:"model"`
			Prompt    *int `json:"prompt"`
			Input     *int `json:"input"`
			MaxTokens *int `json:"max_tokens"`
		}
		if json.Unmarshal([]byte(`{`+string(key)+`:1}`), &v) != nil {
			return
		}
		got := string(fold([]byte(name), nil))
		for want, set := range map[string]bool{"messages": v.Messages != nil, "model": v.Model != nil, "prompt": v.Prompt != nil,
			"input": v.Input != nil, "max_tokens": v.MaxTokens != nil} {
			if set && got != want {
				t.Fatalf("encoding/json reads %q as %q; it folds to %q", name, want, got)
			}
		}
	})
}
