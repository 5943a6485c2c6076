package tokens

import (
	"math/rand/v2"
	"testing"
)

// The providers' published examples, and the shapes around them.
func TestImageCostPublishedExamples(t *testing.T) {
	cases := []struct {
		model  string
		api    bool // Anthropic's API
		w, h   int
		detail string
		want   int
	}{
		// OpenAI's guide, tile models.
		{"gpt-4o", false, 1024, 1024, "high", 765},
		{"gpt-4o", false, 2048, 4096, "high", 1105},
		{"gpt-4o", false, 4096, 8192, "low", 85},
		{"gpt-4o-2024-08-06", false, 1024, 1024, "auto", 765},
		{"gpt-4.1", false, 1024, 1024, "high", 765},
		{"gpt-4o-mini", false, 1024, 1024, "high", 2833 + 4*5667},
		{"gpt-4o-mini", false, 1024, 1024, "low", 2833},
		{"o1", false, 1024, 1024, "high", 75 + 4*150},
		{"o3-2025-04-16", false, 128, 64, "high", 75 + 150},
		{"gpt-5", false, 1024, 1024, "high", 70 + 4*140},
		{"gpt-5-chat-latest", false, 512, 512, "high", 70 + 140},
		{"computer-use-preview", false, 1024, 1024, "high", 65 + 4*129},
		// OpenAI's guide, patch models: 1024×1024 is 1024 patches,
		// 1800×2400 scales to 1452; times the model's multiplier, up.
		{"gpt-4.1-mini", false, 1024, 1024, "high", 1659},
		{"gpt-4.1-mini", false, 1800, 2400, "high", 2353},
		{"gpt-4.1-nano", false, 1024, 1024, "high", 2520},
		{"o4-mini", false, 1800, 2400, "high", 2498},
		{"gpt-5-mini", false, 1024, 1024, "low", 1659}, // low does not lower a patch bill
		{"gpt-5.4-mini", false, 1024, 1024, "high", 1659},
		{"gpt-5.2", false, 1024, 1024, "high", 1229},
		// Anthropic's guide: w×h/750.
		{"claude-sonnet-4-5", true, 1092, 1092, "", 1590},
		{"claude-sonnet-4-5", true, 200, 200, "", 54},
		{"claude-sonnet-4-5", true, 1000, 1000, "", 1334},
		{"anthropic.claude-3-5-sonnet-20241022-v2:0", false, 1000, 1000, "", 1334},
		{"unknown-model", true, 1000, 1000, "", 1334}, // Anthropic's API prices its own models
		// Routers' prefixes.
		{"openai/gpt-4o", false, 1024, 1024, "high", 765},
		{"ft:gpt-4o-mini:acme::abc", false, 1024, 1024, "low", 2833},
	}
	for _, c := range cases {
		img := imageRef{present: true, detail: c.detail, width: c.w, height: c.h}
		if got := imageCost(c.model, c.api, img); got != c.want {
			t.Errorf("%s %dx%d %s: %d tokens, want %d", c.model, c.w, c.h, c.detail, got, c.want)
		}
	}
}

// A dimension never rounds to nothing: thin images cost what the provider
// bills for the pixels it keeps.
func TestImageCostDegenerateShapes(t *testing.T) {
	cases := []struct {
		model string
		w, h  int
		min   int
	}{
		{"gpt-4o", 4097, 1, 85 + 4*170},   // 2048×1: four tiles
		{"gpt-4o", 1, 100000, 85 + 4*170}, // 1×2048
		{"gpt-4o", 100000, 3, 85 + 4*170}, //
		{"gpt-4.1-mini", 100000, 1, 2489}, // the whole budget
		{"gpt-4.1-mini", 1, 49153, 1536 * 162 / 100},
		{"gpt-4.1-mini", 3, 1, 2},       // one patch
		{"claude-opus-4", 100000, 1, 3}, // 1568×1
	}
	for _, c := range cases {
		got := imageCost(c.model, false, imageRef{present: true, detail: "high", width: c.w, height: c.h})
		if got < c.min {
			t.Errorf("%s %dx%d: %d tokens, want at least %d", c.model, c.w, c.h, got, c.min)
		}
	}
}

// An unknown model pays the highest family's price for the same image;
// an unreadable size pays the largest image's.
func TestImageCostUnknownIsHighest(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 2000; i++ {
		img := imageRef{present: true, width: 1 + r.IntN(9000), height: 1 + r.IntN(9000)}
		if r.IntN(3) == 0 {
			img.detail = "low"
		}
		unknown := imageCost("mystery-model", false, img)
		remote := img
		remote.width, remote.height = 0, 0
		for _, f := range allFamilies {
			if c := f.cost(img); c > unknown {
				t.Fatalf("%dx%d %s: unknown model %d below a family's %d", img.width, img.height, img.detail, unknown, c)
			}
			if c, far := f.cost(img), f.cost(remote); c > far {
				t.Fatalf("%dx%d %s: %d above the unknown size's %d (%+v)", img.width, img.height, img.detail, c, far, f)
			}
		}
	}
}

// A PDF page is priced as a page image for the request's model.
func TestPDFPagePerModel(t *testing.T) {
	for _, c := range []struct {
		p    pricing
		want int
	}{
		{pricing{model: "gpt-4o"}, 765},
		{pricing{model: "claude-sonnet-4-5", anthropic: true}, 1600},
		{pricing{model: "gpt-4o-mini"}, 2833 + 4*5667},
	} {
		if got := c.p.pdfPage(); got != c.want {
			t.Errorf("%s: page %d, want %d", c.p.model, got, c.want)
		}
	}
}
