package usage_test

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/usage"
)

// The proxy asked an OpenAI stream for its usage on behalf of a client
// that did not: the client gets the stream without it, the budget gets the
// usage.
func ExampleNewReader() {
	upstream := "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}\n\n" +
		"data: [DONE]\n\n"
	body := usage.NewReader(io.NopCloser(strings.NewReader(upstream)),
		usage.Options{API: usage.OpenAIChat, Stream: true, Strip: true},
		func(r usage.Result) {
			fmt.Printf("reported=%v input=%d output=%d complete=%v\n", r.Reported, r.Usage.Input, r.Usage.Output, r.Complete)
		})
	io.Copy(os.Stdout, body) // httputil.ReverseProxy copies it to the client
	body.Close()             // and always closes it
	// Output:
	// data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hi"}}]}
	//
	// data: [DONE]
	//
	// reported=true input=9 output=1 complete=true
}

// An Anthropic answer: input is every input token read, cache reads and
// writes included.
func ExampleNewReader_anthropic() {
	answer := `{"type":"message","content":[{"type":"text","text":"Hi"}],` +
		`"usage":{"input_tokens":12,"cache_creation_input_tokens":300,"cache_read_input_tokens":4000,"output_tokens":9}}`
	body := usage.NewReader(io.NopCloser(strings.NewReader(answer)), usage.Options{API: usage.Anthropic},
		func(r usage.Result) { fmt.Printf("%+v total=%d\n", r.Usage, r.Usage.Total()) })
	io.Copy(io.Discard, body)
	body.Close()
	// Output:
	// {Input:4312 CachedInput:4000 CacheWrite:300 Output:9 Reasoning:0} total=4321
}

// The client left mid-stream and no usage came: the output text that
// passed is counted with the request's tokenizer.
func ExampleResult_fallback() {
	stream := "data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\" world\"}}]}\n\n"
	words := func(text []byte) int { return len(strings.Fields(string(text))) }
	body := usage.NewReader(io.NopCloser(strings.NewReader(stream)),
		usage.Options{API: usage.OpenAIChat, Stream: true, Count: words},
		func(r usage.Result) { fmt.Printf("reported=%v output=%d\n", r.Reported, r.Output) })
	io.Copy(io.Discard, body)
	body.Close()
	// Output:
	// reported=false output=2
}
