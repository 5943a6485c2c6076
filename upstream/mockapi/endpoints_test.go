package mockapi_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/mockapi"
)

func TestOtherEndpoints(t *testing.T) {
	srv := newServer(t, mockapi.New())

	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "ok" {
		t.Errorf("healthz = %d %q", resp.StatusCode, b)
	}

	resp, err = http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object string
		} `json:"data"`
	}
	decode(t, resp.Body, &models)
	resp.Body.Close()
	if models.Object != "list" || len(models.Data) < 3 || models.Data[0].ID != "gpt-4o-mini" {
		t.Errorf("models = %+v", models)
	}

	var cmpl struct {
		Object  string
		Choices []struct{ Text string }
	}
	decode(t, post(t, srv.URL+"/v1/completions", "application/json", `{"prompt":"hi"}`).Body, &cmpl)
	if cmpl.Object != "text_completion" || len(cmpl.Choices) != 1 || cmpl.Choices[0].Text != "This is a mock reply to: hi" {
		t.Errorf("completion = %+v", cmpl)
	}

	var emb, emb2 struct {
		Object string
		Data   []struct{ Embedding []float64 }
	}
	decode(t, post(t, srv.URL+"/v1/embeddings", "application/json", `{"input":["a","b"]}`).Body, &emb)
	decode(t, post(t, srv.URL+"/v1/embeddings", "application/json", `{"input":"a"}`).Body, &emb2)
	if emb.Object != "list" || len(emb.Data) != 2 || len(emb.Data[0].Embedding) != 8 || len(emb2.Data) != 1 {
		t.Fatalf("embeddings = %+v", emb)
	}
	for i, v := range emb.Data[0].Embedding {
		if v != emb2.Data[0].Embedding[i] {
			t.Errorf("embedding not deterministic at %d: %v vs %v", i, v, emb2.Data[0].Embedding[i])
		}
	}

	var rsp struct {
		Object string
		Output []struct {
			Content []struct{ Type, Text string }
		}
	}
	decode(t, post(t, srv.URL+"/v1/responses", "application/json", `{"input":"yo"}`).Body, &rsp)
	if rsp.Object != "response" || len(rsp.Output) != 1 || len(rsp.Output[0].Content) != 1 ||
		rsp.Output[0].Content[0].Type != "output_text" || rsp.Output[0].Content[0].Text != "This is a mock reply to: yo" {
		t.Errorf("response = %+v", rsp)
	}

	var msg struct {
		ID, Type, Role, Model string
		StopReason            string `json:"stop_reason"`
		Content               []struct{ Type, Text string }
		Usage                 struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		}
	}
	body := `{"model":"claude-x","system":"s","messages":[{"role":"user","content":"hey"}]}`
	decode(t, post(t, srv.URL+"/v1/messages", "application/json", body).Body, &msg)
	if !strings.HasPrefix(msg.ID, "msg_mock_") || msg.Type != "message" || msg.Model != "claude-x" ||
		msg.StopReason != "end_turn" || len(msg.Content) != 1 || msg.Content[0].Text != "This is a mock reply to: hey" ||
		msg.Usage.InputTokens == 0 || msg.Usage.OutputTokens == 0 {
		t.Errorf("message = %+v", msg)
	}
}

func TestReplyTruncated(t *testing.T) {
	srv := newServer(t, mockapi.New())
	long := strings.Repeat("é", 150) // 300 bytes
	resp := post(t, srv.URL+"/api/chat", "application/json", `{"message":"`+long+`"}`)
	var got struct{ Reply string }
	decode(t, resp.Body, &got)
	echoed := strings.TrimPrefix(got.Reply, "This is a mock reply to: ")
	if len(echoed) != 200 || !strings.HasPrefix(long, echoed) {
		t.Errorf("echoed %d bytes, want 200", len(echoed))
	}
}
