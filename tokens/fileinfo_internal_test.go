package tokens

import "testing"

// What is said of a file names its format only when nothing contradicts
// it; a type that says nothing leaves the name to say it.
func TestFileInfoNames(t *testing.T) {
	cases := []struct {
		fi   fileInfo
		kind string
		want bool
	}{
		{fileInfo{mediaType: "application/pdf", filename: "a.pdf"}, "pdf", true},
		{fileInfo{mediaType: "application/pdf"}, "pdf", true},
		{fileInfo{mediaType: "application/pdf", filename: "notes.txt"}, "pdf", false},
		{fileInfo{mediaType: "application/octet-stream", filename: "report.pdf"}, "pdf", true},
		{fileInfo{mediaType: "", filename: "report.PDF"}, "pdf", true},
		{fileInfo{mediaType: "application/octet-stream", filename: "report"}, "pdf", false},
		{fileInfo{mediaType: "text/plain", filename: "a.pdf"}, "pdf", false},
		{fileInfo{mediaType: "image/png; x=1", filename: "a.png"}, "image", true},
		{fileInfo{mediaType: "image/png", slot: "audio"}, "image", false},
		{fileInfo{slot: "image"}, "image", true},
		{fileInfo{mediaType: "audio/wav", filename: "a.wav"}, "audio", true},
		{fileInfo{mediaType: "audio/wav", filename: "a.txt"}, "audio", false},
	}
	for _, c := range cases {
		if got := c.fi.names(c.kind); got != c.want {
			t.Errorf("%+v names %s: %v, want %v", c.fi, c.kind, got, c.want)
		}
	}
}
