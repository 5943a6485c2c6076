package audio_test

import (
	"encoding/binary"
	"fmt"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens/audio"
)

// A WAV file: its samples are accounted for as PCM (the caller costs
// them at the higher of their readings as sound and as text); its LIST
// chunk of metadata is handed back raw, to be costed as text.
func ExampleMeasure() {
	le := binary.LittleEndian
	wav := []byte("RIFF\x00\x00\x00\x00WAVEfmt \x10\x00\x00\x00")
	wav = le.AppendUint16(wav, 1)     // PCM
	wav = le.AppendUint16(wav, 1)     // mono
	wav = le.AppendUint32(wav, 16000) // sample rate
	wav = le.AppendUint32(wav, 32000) // byte rate
	wav = le.AppendUint16(wav, 2)     // block align
	wav = le.AppendUint16(wav, 16)    // bits per sample
	wav = append(wav, "LIST\x0a\x00\x00\x00INFOtitle."...)
	wav = append(wav, "data\x00\x00\x00\x00"...) // size 0: streamed
	wav = append(wav, make([]byte, 64000)...)

	res, err := audio.Measure(wav, audio.Limits{}, func(raw []byte) error {
		fmt.Printf("raw: %q\n", raw)
		return nil
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.PCMDuration, audio.Tokens(res.PCMDuration), "tokens,", len(res.PCM), "bytes of samples")
	// Output:
	// raw: "LIST\n\x00\x00\x00INFOtitle."
	// 2s 20 tokens, 64000 bytes of samples
}
