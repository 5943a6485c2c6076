package tokens_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// BenchmarkReadFields reads key parts from bodies an attacker shapes:
// a chat body, members along the path repeated in depth, many members in
// the object a path reads, deep XML, a form of many pairs and a multipart
// body of many parts; the cost must stay linear in the size.
func BenchmarkReadFields(b *testing.B) {
	f := &tokens.Fields{
		JSON: []string{"metadata.user_id", "a.a.a.a.a.a.a.a", "messages.1.content"},
		XML:  []string{"dRucEm", "absent"},
		Form: []string{"user", "absent"},
	}
	shapes := []struct {
		name, ct string
		body     func(n int) string
	}{
		{"chat", "application/json", func(n int) string { return chatBody(prose(n)) }},
		{"json-wide", "application/json", func(n int) string {
			var s strings.Builder
			s.WriteString(`{"metadata":{`)
			for i := 0; s.Len() < n; i++ {
				fmt.Fprintf(&s, `"user_%d":"x",`, i)
			}
			s.WriteString(`"user_id":"a"}}`)
			return s.String()
		}},
		{"json-deep", "application/json", func(n int) string {
			k := 160
			return `{"pad":"` + strings.Repeat("p", max(n-k*12, 0)) + `","a":` + strings.Repeat(`{"a":[{"a":`, k/2) + "1" + strings.Repeat("}]}", k/2) + "}"
		}},
		{"xml-deep", "application/xml", func(n int) string {
			k := min(n/7, 999)
			return strings.Repeat("<a x='1'>", k) + strings.Repeat("t", max(n-k*16, 0)) + "<dRucEm>1</dRucEm>" + strings.Repeat("</a>", k)
		}},
		{"xml-wide", "application/xml", func(n int) string {
			return "<r>" + strings.Repeat("<e a='1' b='2'/>", n/16) + "</r>"
		}},
		{"form", "application/x-www-form-urlencoded", func(n int) string {
			return strings.Repeat("x=1&y;z&%75s=%zz&", n/16) + "user=eve"
		}},
		{"multipart", "multipart/form-data; boundary=b", func(n int) string {
			return strings.Repeat(part("x", "y"), n/48) + part("user", "eve") + "--b--\r\n"
		}},
	}
	for _, s := range shapes {
		for _, size := range []int{1 << 10, 64 << 10, 1 << 20} {
			body := s.body(size)
			b.Run(fmt.Sprintf("%s/%dKiB", s.name, size>>10), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					if _, _, err := tk.ReadFields(tokens.Request{ContentType: s.ct, Body: []byte(body), Fields: f}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
