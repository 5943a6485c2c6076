// The gen subcommand: the upload bodies.

package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
)

func gen(args []string) error {
	fs := flag.NewFlagSet("gen", flag.ContinueOnError)
	kind := fs.String("kind", "binary", "binary (application/pdf file part), text (text/plain file part) or small (JSON chat body)")
	total := fs.Int64("bytes", 10<<20, "total body size in `bytes`")
	out := fs.String("out", "", "output `file`")
	seed := fs.Uint64("seed", 1, "random seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("gen: -out is required")
	}
	rng := rand.New(rand.NewPCG(*seed, *seed^0x9e3779b97f4a7c15))

	if *kind == "small" {
		body := smallBody(int(*total))
		if err := os.WriteFile(*out, body, 0o644); err != nil {
			return err
		}
		fmt.Printf("%d application/json\n", 0)
		return nil
	}

	var b [16]byte
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	boundary := "bench" + hex.EncodeToString(b[:])
	var name, ctype string
	switch *kind {
	case "binary":
		name, ctype = "doc.pdf", "application/pdf"
	case "text":
		name, ctype = "notes.txt", "text/plain; charset=utf-8"
	default:
		return fmt.Errorf("gen: unknown -kind %q", *kind)
	}
	head := "--" + boundary + "\r\n" +
		"Content-Disposition: form-data; name=\"message\"\r\n\r\n" +
		"Summarise the attached document in three bullet points.\r\n" +
		"--" + boundary + "\r\n" +
		"Content-Disposition: form-data; name=\"file\"; filename=\"" + name + "\"\r\n" +
		"Content-Type: " + ctype + "\r\n\r\n"
	tail := "\r\n--" + boundary + "--\r\n"
	fileBytes := *total - int64(len(head)+len(tail))
	if fileBytes < 1 {
		return fmt.Errorf("gen: -bytes %d is too small for the multipart framing", *total)
	}

	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	w.WriteString(head)
	switch *kind {
	case "binary":
		writeBinary(w, rng, fileBytes)
	case "text":
		writeText(w, rng, fileBytes)
	}
	w.WriteString(tail)
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	// The delimiter must not occur inside the file part.
	body, err := os.ReadFile(*out)
	if err != nil {
		return err
	}
	if int64(len(body)) != *total {
		return fmt.Errorf("gen: wrote %d bytes, want %d", len(body), *total)
	}
	if bytes.Count(body, []byte("\r\n--"+boundary)) != 2 {
		return errors.New("gen: the boundary occurs inside the file part; change -seed")
	}
	fmt.Printf("%d multipart/form-data; boundary=%s\n", fileBytes, boundary)
	return nil
}

// writeBinary writes a PDF-looking header, then random bytes.
func writeBinary(w *bufio.Writer, rng *rand.Rand, n int64) {
	hdr := "%PDF-1.7\n%\xe2\xe3\xcf\xd3\n"
	if n <= int64(len(hdr)) {
		w.WriteString(hdr[:n])
		return
	}
	w.WriteString(hdr)
	n -= int64(len(hdr))
	var buf [8192]byte
	for n > 0 {
		for i := 0; i < len(buf); i += 8 {
			v := rng.Uint64()
			for j := range 8 {
				buf[i+j] = byte(v >> (8 * j))
			}
		}
		k := min(n, int64(len(buf)))
		w.Write(buf[:k])
		n -= k
	}
}

// writeText writes random words in sentences and lines of about 80 bytes,
// exactly n bytes in all (the last line is cut to fit).
func writeText(w *bufio.Writer, rng *rand.Rand, n int64) {
	var line []byte
	start := true
	for n > 0 {
		line = line[:0]
		for len(line) < 72 {
			word := words[rng.IntN(len(words))]
			if start {
				line = append(line, strings.ToUpper(word[:1])+word[1:]...)
				start = false
			} else {
				line = append(line, word...)
			}
			switch r := rng.IntN(12); {
			case r == 0:
				line = append(line, ". "...)
				start = true
			case r == 1:
				line = append(line, ", "...)
			default:
				line = append(line, ' ')
			}
		}
		line = append(bytes.TrimRight(line, " "), '\n')
		if int64(len(line)) > n {
			line = line[:n]
		}
		w.Write(line)
		n -= int64(len(line))
	}
}

// smallBody is an /api/chat JSON body of exactly size bytes (at least 40).
func smallBody(size int) []byte {
	const pre, post = `{"message":"`, `"}`
	text := "Explain in one sentence why a reverse proxy should rate-limit each caller before it forwards chat requests to an upstream LLM API. "
	msg := make([]byte, 0, size)
	for len(msg) < size-len(pre)-len(post) {
		msg = append(msg, text...)
	}
	msg = msg[:max(size-len(pre)-len(post), 0)]
	return []byte(pre + string(msg) + post)
}

// ----------------------------------------------------------------- fire ---
