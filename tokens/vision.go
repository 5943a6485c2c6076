package tokens

import (
	"math"
	"strings"
)

// How each provider bills an image, by model.
//
// Sources, as read on 2026-11-28:
//   - OpenAI, "Images and vision" guide, section "Calculating costs": the
//     tile formula (fit in 2048×2048, short side to 768, 512-px tiles at a
//     per-model base and tile price) and the patch formula (32-px patches,
//     scaled down to a budget of 1536, times a per-model multiplier).
//   - Measurements published in OpenAI's developer forum (2025–2026) for
//     models the guide does not list: the gpt-5.x models bill patches with
//     a budget of 2500 at "high" and a multiplier of 1.2, and "detail":
//     "low" does not lower a patch model's bill.
//   - Anthropic, "Vision" guide: tokens = width × height / 750 after the
//     long edge is brought down to 1568 px, about 1600 at most.
//
// Where the guide and the measurements disagree (gpt-5-mini's multiplier:
// 1.62 in the guide, 1.2 measured), the higher figure is kept: the proxy's
// estimate is an upper bound of the bill. A model no row names is priced at
// the highest family's price for the image at hand.

// imageRef is an image part of a request: its detail and, when its bytes
// are inline and walk as an image, its dimensions.
type imageRef struct {
	present bool
	detail  string
	width   int
	height  int
}

// visionKind is a pricing formula.
type visionKind uint8

const (
	visionTiles     visionKind = iota // OpenAI's 512-px tiles
	visionPatches                     // OpenAI's 32-px patches
	visionAnthropic                   // Anthropic's pixels / 750
)

// visionFamily is one pricing family: its formula and that formula's
// numbers.
type visionFamily struct {
	kind       visionKind
	base, tile int // tiles: low detail costs base; high, base + tile per tile
	budget     int // patches: the most patches an image is scaled to
	mult100    int // patches: the model's multiplier, in hundredths
}

var (
	tiles4o      = visionFamily{kind: visionTiles, base: 85, tile: 170}
	tiles4oMini  = visionFamily{kind: visionTiles, base: 2833, tile: 5667}
	tilesO       = visionFamily{kind: visionTiles, base: 75, tile: 150}
	tiles5       = visionFamily{kind: visionTiles, base: 70, tile: 140}
	tilesCUA     = visionFamily{kind: visionTiles, base: 65, tile: 129}
	patchesMini  = visionFamily{kind: visionPatches, budget: 1536, mult100: 162}
	patchesNano  = visionFamily{kind: visionPatches, budget: 1536, mult100: 246}
	patchesO4    = visionFamily{kind: visionPatches, budget: 1536, mult100: 172}
	patches5x    = visionFamily{kind: visionPatches, budget: 2500, mult100: 120}
	anthropicPix = visionFamily{kind: visionAnthropic}
)

// visionRows name the families by model prefix; the first row whose prefix
// the (lower-cased) model starts with and whose every infix it contains
// wins, so the more specific rows come first.
var visionRows = []struct {
	prefix string
	infix  string
	fam    visionFamily
}{
	{"gpt-4o-mini", "", tiles4oMini},
	{"gpt-4o", "", tiles4o},
	{"chatgpt-4o", "", tiles4o},
	{"gpt-4.1-mini", "", patchesMini},
	{"gpt-4.1-nano", "", patchesNano},
	{"gpt-4.1", "", tiles4o},
	{"gpt-4.5", "", tiles4o},
	{"gpt-4-", "", tiles4o},
	{"gpt-5", "-mini", patchesMini},
	{"gpt-5", "-nano", patchesNano},
	{"gpt-5.", "", patches5x},
	{"gpt-5", "", tiles5},
	{"o4-mini", "", patchesO4},
	{"codex-mini", "", patchesO4},
	{"o1", "", tilesO},
	{"o3", "", tilesO},
	{"computer-use", "", tilesCUA},
}

// allFamilies are the families an unknown model may belong to.
var allFamilies = []visionFamily{tiles4o, tiles4oMini, tilesO, tiles5, tilesCUA,
	patchesMini, patchesNano, patchesO4, patches5x, anthropicPix}

// familyOf returns the model's family, and false when no row names it.
func familyOf(model string) (visionFamily, bool) {
	m := strings.ToLower(strings.TrimSpace(model))
	// A router's prefix ("openai/gpt-4o", "ft:gpt-4o-mini:…") does not
	// change the model; a Claude model is one under any name
	// ("anthropic.claude-…" on Bedrock, "claude-…@…" on Vertex).
	if j := strings.LastIndexByte(m, '/'); j >= 0 {
		m = m[j+1:]
	}
	m = strings.TrimPrefix(m, "ft:")
	if strings.Contains(m, "claude") {
		return anthropicPix, true
	}
	for _, r := range visionRows {
		if strings.HasPrefix(m, r.prefix) && strings.Contains(m[len(r.prefix):], r.infix) {
			return r.fam, true
		}
	}
	return visionFamily{}, false
}

// imageCost is what img costs for model: by its family's formula, or the
// highest of every family's when the model is unknown (Anthropic's when
// the request is in Anthropic's own API, whose models are all priced so).
func imageCost(model string, anthropicAPI bool, img imageRef) int {
	if f, ok := familyOf(model); ok {
		return f.cost(img)
	}
	if anthropicAPI {
		return anthropicPix.cost(img)
	}
	most := 0
	for _, f := range allFamilies {
		most = max(most, f.cost(img))
	}
	return most
}

// cost is img's price in the family. A size the proxy could not read
// (a remote URL, a format not read here) costs the largest image the
// formula bills at img's detail.
func (f visionFamily) cost(img imageRef) int {
	w, h := img.width, img.height
	known := w > 0 && h > 0
	switch f.kind {
	case visionTiles:
		if img.detail == "low" {
			return f.base
		}
		if !known {
			// The most tiles: 768 × 2048, 2 × 4.
			return f.base + 8*f.tile
		}
		return f.base + f.tile*tiles(w, h)
	case visionPatches:
		// "low" does not lower a patch model's bill.
		n := f.budget
		if known {
			n = patches(w, h, f.budget)
		}
		return (n*f.mult100 + 99) / 100
	default:
		if !known {
			return anthropicMax
		}
		return anthropicPixels(w, h)
	}
}

// tiles is the number of 512-px tiles of a w×h image at high detail: fitted
// in 2048×2048, its short side brought down to 768. Every scaled side is
// rounded up and at least one pixel (a 4097×1 image still covers tiles).
func tiles(w, h int) int {
	if long := max(w, h); long > 2048 {
		w, h = scaleUp(w, 2048, long), scaleUp(h, 2048, long)
	}
	if short := min(w, h); short > 768 {
		w, h = scaleUp(w, 768, short), scaleUp(h, 768, short)
	}
	return ceilDiv(w, 512) * ceilDiv(h, 512)
}

// scaleUp is ⌈v × num / den⌉, at least 1, in integers (no float edge can
// move a side across a tile boundary).
func scaleUp(v, num, den int) int {
	return max(1, int((int64(v)*int64(num)+int64(den)-1)/int64(den)))
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// patches is OpenAI's patch count for a w×h image under budget: the 32-px
// patches that cover it, or, past the budget, those of the image scaled
// down so that whole patches fit the budget. A shape so thin that the
// scaled image would lose a whole side is billed the budget.
func patches(w, h, budget int) int {
	raw := int64(ceilDiv(w, 32)) * int64(ceilDiv(h, 32))
	if raw <= int64(budget) {
		return int(raw)
	}
	fw, fh := float64(w), float64(h)
	shrink := math.Sqrt(32 * 32 * float64(budget) / (fw * fh))
	pw, ph := fw*shrink/32, fh*shrink/32
	if math.Floor(pw) < 1 || math.Floor(ph) < 1 {
		return budget
	}
	adj := shrink * math.Min(math.Floor(pw)/pw, math.Floor(ph)/ph)
	n := math.Ceil(fw*adj/32) * math.Ceil(fh*adj/32)
	return int(math.Min(n, float64(budget)))
}

// anthropicMax is the most one image costs on Anthropic's models.
const anthropicMax = 1600

// anthropicPixels is Anthropic's w×h/750, the long edge brought down to
// 1568 first, at least 1 and at most anthropicMax.
func anthropicPixels(w, h int) int {
	if long := max(w, h); long > 1568 {
		w, h = scaleUp(w, 1568, long), scaleUp(h, 1568, long)
	}
	return min(max(1, ceilDiv(w*h, 750)), anthropicMax)
}
