package audio_test

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"strings"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens/audio"
)

// A WAV file arrives as base64 in a JSON body (OpenAI's input_audio); the
// meter reads it as it is decoded, without holding it.
func ExampleMeter() {
	// Two seconds of 16 kHz, 16-bit mono PCM.
	le := binary.LittleEndian
	wav := []byte("RIFF\x00\x00\x00\x00WAVEfmt \x10\x00\x00\x00")
	wav = le.AppendUint16(wav, 1)                // PCM
	wav = le.AppendUint16(wav, 1)                // mono
	wav = le.AppendUint32(wav, 16000)            // sample rate
	wav = le.AppendUint32(wav, 32000)            // byte rate
	wav = le.AppendUint16(wav, 2)                // block align
	wav = le.AppendUint16(wav, 16)               // bits per sample
	wav = append(wav, "data\x00\x00\x00\x00"...) // size 0: streaming
	wav = append(wav, make([]byte, 64000)...)
	data := base64.StdEncoding.EncodeToString(wav)

	m := audio.NewMeter("wav")
	if _, err := io.Copy(m, base64.NewDecoder(base64.StdEncoding, strings.NewReader(data))); err != nil {
		panic(err)
	}
	d := m.Duration()
	fmt.Println(d, audio.Tokens(d), "tokens")

	// Bytes of no known format cost their size at 16 kbit/s.
	m = audio.NewMeter("")
	m.Write(make([]byte, 10000))
	fmt.Println(m.Duration(), audio.Tokens(m.Duration()), "tokens")
	// Output:
	// 2s 20 tokens
	// 5s 50 tokens
}
