package pdf

import (
	"bytes"
	"fmt"
	"testing"
)

func BenchmarkRead(b *testing.B) {
	typical := newDoc()
	for i := 0; i < 3; i++ {
		typical.textPage(show(
			fmt.Sprintf("Page %d of a short report.", i+1),
			"The quarterly numbers are in line with the forecast;",
			"revenue grew by four percent and costs stayed flat.",
		), true)
	}
	type bench struct {
		name string
		data []byte
	}
	cases := []bench{{"typical-3-pages", typical.bytes()}}
	for _, kb := range []int{8, 80, 800} {
		content, _ := attackContent(kb << 10)
		d := newDoc()
		d.textPage(content, true)
		data := d.bytes()
		cases = append(cases, bench{fmt.Sprintf("attack-%dKB-text", kb), data})
		if kb == 80 {
			// The same file with a broken xref: read by the scan.
			broken := bytes.Replace(data, []byte("startxref\n"), []byte("startxref\n9"), 1)
			cases = append(cases, bench{"attack-80KB-text-scan", broken})
		}
	}
	cases = append(cases, bench{"bomb-1GiB", bombCases()["nested page content"]})
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.data)))
			var text int
			for i := 0; i < b.N; i++ {
				text = 0
				_, err := Read(c.data, testLimits, func(p []byte) error { text += len(p); return nil })
				if err != nil && c.name != "bomb-1GiB" {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(text), "text-B/op")
		})
	}
}
