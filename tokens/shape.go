package tokens

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// The shapes of the APIs of SPEC §3, as data. The walker (formats.go)
// reads a body by these tables and counts by default: inside messages,
// content parts, blocks, items and the other text members, every string
// is text the model reads unless its member is known metadata. A block
// type invented tomorrow therefore costs tokens instead of opening a hole.
//
// Member names are matched as the most lenient common upstream matches
// them: after JSON unescaping, and with Unicode simple case folding (Go's
// encoding/json, used by Ollama and LocalAI, reads "Messages" and
// "meſſages" as "messages"). Tables are keyed by the folded form (fold).

// topMember is what a top-level member of a request is to the counter.
type topMember uint8

const (
	topSkip     topMember = iota // parameters: temperature, metadata, user, …
	topDecided                   // a member the proxy decides on: counted nowhere, never repeated
	topMessages                  // chat or Anthropic messages: per-message overhead, then content
	topPrompt                    // prompt / input: strings, token ids, batches, Responses items
	topContent                   // text by default (system, instructions, suffix, history, …)
	topSchema                    // a JSON schema: every member name and string counts
	topTools                     // tool definitions: the published formula, never below the schema count
	topImages                    // Ollama's images: base64 images
)

// topMembers holds the top-level members that carry text, by folded name.
// One table serves every path: a member that any API of §3 reads costs
// tokens wherever it is sent, since the proxy cannot know which API the
// upstream really is.
var topMembers = map[string]topMember{
	"messages":     topMessages,
	"prompt":       topPrompt,
	"input":        topPrompt,
	"suffix":       topContent, // legacy completions: the model reads it after the prompt
	"instructions": topContent, // Responses API
	"system":       topContent, // Anthropic, /api/chat, Ollama
	"message":      topContent, // /api/chat
	"history":      topContent, // /api/chat
	"tools":        topTools,
	"functions":    topTools,
	// Structured-output schemas: the model is shown them.
	"response_format": topSchema,  // chat completions
	"text":            topSchema,  // Responses: text.format
	"format":          topSchema,  // Ollama: "json" or a schema
	"images":          topImages,  // Ollama generate
	"template":        topContent, // Ollama generate: the prompt template
	"context":         topPrompt,  // Ollama generate: token ids of the conversation so far
	"documents":       topContent, // vLLM and Cohere-style retrieval documents
	"chat_template":   topContent, // vLLM: the template the messages are rendered with
}

// decidedMembers are the top-level members the proxy decides on (the
// model picks the tokenizer; stream and the output-token fields matter to
// token budgets, SPEC §8). One that appears twice in the top-level object,
// in any spelling, makes the body invalid: the proxy cannot know which copy
// the upstream will read.
var decidedMembers = []string{"model", "stream", "max_tokens", "max_completion_tokens", "max_output_tokens"}

// decidedIndex maps a folded decided member to its bit in a seen-set.
var decidedIndex = func() map[string]uint {
	m := map[string]uint{}
	for i, name := range decidedMembers {
		m[name] = uint(i)
	}
	return m
}()

// partKey is what a member inside content (a message, part, block, item)
// is to the counter. The zero value is the default: text.
type partKey uint8

const (
	partText      partKey = iota // a string counts; an object or array is walked
	partMeta                     // a string is metadata and does not count; an object or array is walked
	partType                     // "type": metadata, remembered to cost the block
	partMediaType                // media_type, mime_type: metadata, remembered
	partDetail                   // an image's detail: metadata, remembered
	partName                     // counted; in a chat message it costs one token more
	partImageURL                 // OpenAI image_url: a URL or data URL string, or {url, detail}
	partSource                   // Anthropic source: an object, or a string (search_result)
	partFile                     // OpenAI chat file part: {file_data, filename, file_id}
	partFileData                 // a data URL or base64 file (Responses input_file)
	partAudio                    // OpenAI input_audio: {data, format}
	partImages                   // Ollama message images: base64 strings
	partRaw                      // counted as its JSON text, member names included (tool_use input)
	partFormat                   // a string is metadata (an audio format); an object is a schema
	partFilename                 // counted, and remembered to classify a file
	partResult                   // text, or a generated image when the part is an image_generation_call
)

// partKeys holds the content members that are not plain text, by folded
// name. Any member whose folded name ends in "_id" is metadata too (ids of
// calls, tools, files, previous responses).
var partKeys = map[string]partKey{
	"type":              partType,
	"id":                partMeta,
	"media_type":        partMediaType,
	"mime_type":         partMediaType,
	"detail":            partDetail,
	"status":            partMeta,
	"object":            partMeta,
	"signature":         partMeta, // Anthropic thinking: an opaque check, not text
	"encrypted_content": partMeta, // Responses reasoning: opaque to anyone but the provider
	"name":              partName,
	"image_url":         partImageURL,
	"source":            partSource,
	"file":              partFile,
	"file_data":         partFileData,
	"input_audio":       partAudio,
	"images":            partImages,
	"input":             partRaw,
	"format":            partFormat,
	"filename":          partFilename,
	"result":            partResult,
	"file_url":          partMeta, // a remote file the proxy does not fetch (costed as a page)
}

// formatNames are the member names of messages, parts, blocks and items
// that the APIs define: their names are the format, priced by its
// overhead. Any other name inside content is text the model may be shown
// (a client can put prose in a name) and costs as text.
var formatNames = map[string]bool{
	"role": true, "content": true, "text": true, "tool_calls": true, "function": true, "arguments": true,
	"refusal": true, "reasoning_content": true, "reasoning": true, "thinking": true, "tool_use_id": true,
	"cache_control": true, "citations": true, "annotations": true, "audio": true, "data": true, "url": true,
	"title": true, "context": true, "is_error": true, "summary": true, "output": true, "call_id": true,
	"tool_call_id": true, "parameters": true, "description": true, "strict": true, "ephemeral": true,
	"ttl": true, "index": true, "start_index": true, "end_index": true, "cited_text": true,
	"document_index": true, "document_title": true, "transcript": true, "expires_at": true,
	"logprobs": true, "prefix": true, "partial": true, "query": true, "queries": true, "results": true,
	"action": true, "pending_safety_checks": true, "server_label": true, "error": true,
	"search_result": true, "enabled": true, "cache": true, "metadata": true, "value": true, "key": true,
	"prompt": true, "message": true, "messages": true, "system": true, "instructions": true, "input_text": true,
}

func partKeyOf(folded string) partKey {
	if k, ok := partKeys[folded]; ok {
		return k
	}
	if strings.HasSuffix(folded, "_id") {
		return partMeta
	}
	return partText
}

// fold returns name in the form the tables are keyed by: every rune
// replaced by the smallest rune of its Unicode simple-folding orbit, then
// ASCII lowercased. Two names fold alike when Go's encoding/json (and any
// simple case-insensitive matcher) could take one for the other; "ſ"
// (U+017F) folds to "s" and "K" (U+212A) to "k". buf is scratch space; the
// result aliases it or name.
func fold(name, buf []byte) []byte {
	ascii := true
	for _, c := range name {
		if c >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	out := buf[:0]
	if ascii {
		for _, c := range name {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			out = append(out, c)
		}
		return out
	}
	for i := 0; i < len(name); {
		r, size := utf8.DecodeRune(name[i:])
		i += size
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		if 'A' <= least && least <= 'Z' {
			least += 'a' - 'A'
		}
		out = utf8.AppendRune(out, least)
	}
	return out
}
