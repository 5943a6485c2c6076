package tokens

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// pathNode is one member (or index) along the requested JSON paths; the
// paths form a tree so that a body is walked once for all of them.
type pathNode struct {
	name     string // folded member name
	index    int    // the array index the segment also names; -1 when none
	never    bool   // a segment no member name can match (see matchable)
	label    string // the path up to here as the first rule wrote it
	leaves   []int  // the paths that end here
	children []int  // indexes in pathTree
}

// pathTree holds the nodes of the requested paths; [0] is the root.
type pathTree []pathNode

func newPathTree(paths []string) pathTree {
	tree := pathTree{{index: -1}}
	for i, path := range paths {
		cur, end := 0, 0
		for _, seg := range strings.Split(path, ".") {
			if end > 0 {
				end++ // the dot
			}
			end += len(seg)
			name, never := string(fold([]byte(seg), nil)), !matchable(seg)
			next := -1
			for _, c := range tree[cur].children {
				if tree[c].name == name && tree[c].never == never {
					next = c
					break
				}
			}
			if next < 0 {
				next = len(tree)
				tree = append(tree, pathNode{name: name, index: arrayIndex(seg), never: never, label: path[:end]})
				tree[cur].children = append(tree[cur].children, next)
			}
			cur = next
		}
		tree[cur].leaves = append(tree[cur].leaves, i)
	}
	return tree
}

// matchable reports whether a member name can equal seg: jsonReader hands
// out at most 256 bytes of a member name (a longer one comes out as
// invalid UTF-8, which folds to U+FFFD).
func matchable(seg string) bool {
	return len(seg) <= 256 && utf8.ValidString(seg) && !strings.ContainsRune(seg, utf8.RuneError)
}

// arrayIndex is the index a segment of decimal digits names (no leading
// zero but in "0"), -1 for any other segment.
func arrayIndex(seg string) int {
	if seg == "" || len(seg) > 9 || len(seg) > 1 && seg[0] == '0' {
		return -1
	}
	n, err := strconv.Atoi(seg)
	if err != nil || n < 0 || seg[0] == '+' || seg[0] == '-' {
		return -1
	}
	return n
}

// fieldWalker reads a JSON body's model and the values at the requested
// paths, checking every object along a path for a repeated member, and
// the request objects for repeated decided members, as countJSON does.
type fieldWalker struct {
	j     *jsonReader
	tree  pathTree
	vals  []Value
	model string
	buf   [256]byte
}

// jsonFields walks a whole JSON document: its top-level model ("" if none,
// as jsonModel reads it) and the values at paths into vals. validate
// checks strings as UTF-8 (no count follows to do it); either way a value
// returned is valid UTF-8. Walking the whole document is what finds a
// repeated member anywhere.
func jsonFields(body []byte, paths []string, vals []Value, validate bool, wk *work) (string, error) {
	w := &fieldWalker{j: newJSONReader(body), tree: newPathTree(paths), vals: vals}
	w.j.work = wk
	w.j.noUTF8Check = !validate
	if err := w.value(0, 0); err != nil {
		return "", err
	}
	if err := w.j.end(); err != nil {
		return "", err
	}
	return w.model, nil
}

// Levels of a value: the document, a request in a top-level batch, and
// anything deeper.
const (
	levelTop = iota
	levelBatch
	levelDeep
)

// value reads one value at node n (-1: on no path).
func (w *fieldWalker) value(n, level int) error {
	k, err := w.j.kind()
	if err != nil {
		return err
	}
	var node *pathNode
	if n >= 0 {
		node = &w.tree[n]
	}
	inner := node != nil && len(node.children) > 0
	switch {
	case k == '{' && (inner || level <= levelBatch):
		return w.object(node, level)
	case k == '[' && level == levelTop && !w.indexed(node):
		// A batch of requests, as countJSON reads it: the paths apply to
		// each request, which must agree on every value found.
		return w.j.array(func(int) error { return w.value(n, levelBatch) })
	case k == '[' && (inner || level == levelTop):
		return w.array(node, level)
	case node != nil && len(node.leaves) > 0:
		return w.leaf(node, k)
	}
	return w.j.skip()
}

// indexed reports whether some path goes into node by an array index
// (json:0.user names the first request of a batch).
func (w *fieldWalker) indexed(node *pathNode) bool {
	if node == nil {
		return false
	}
	for _, ci := range node.children {
		if w.tree[ci].index >= 0 {
			return true
		}
	}
	return false
}

func (w *fieldWalker) array(node *pathNode, level int) error {
	next := levelDeep
	if level == levelTop {
		next = levelBatch // a batch of requests, as countJSON reads it
	}
	return w.j.array(func(i int) error {
		c := -1
		if node != nil {
			for _, ci := range node.children {
				if w.tree[ci].index == i {
					c = ci
					break
				}
			}
		}
		return w.value(c, next)
	})
}

func (w *fieldWalker) object(node *pathNode, level int) error {
	var decided uint
	var few [64]bool // the members of node seen in this object
	seen := few[:]
	if node != nil && len(node.children) > len(few) {
		seen = make([]bool, len(node.children))
	}
	return w.j.object(func(key []byte) error {
		name := fold(key, w.buf[:0]) // valid until the next key: used before recursing
		child := -1
		if node != nil {
			for i, c := range node.children {
				if !w.tree[c].never && string(name) == w.tree[c].name {
					if seen[i] {
						return duplicate(w.tree[c].label)
					}
					seen[i], child = true, c
					break
				}
			}
		}
		isModel := false
		if level <= levelBatch {
			if bit, ok := decidedIndex[string(name)]; ok {
				if decided&(1<<bit) != 0 {
					return duplicate(decidedMembers[bit])
				}
				decided |= 1 << bit
				isModel = level == levelTop && decidedMembers[bit] == "model"
			}
		}
		if isModel {
			return w.modelValue(child)
		}
		return w.value(child, levelDeep)
	})
}

func duplicate(name string) error {
	return &InvalidError{msg: "duplicate member \"" + name + "\"", final: true}
}

// modelValue reads the top-level model member, which may also be a
// requested path (child).
func (w *fieldWalker) modelValue(child int) error {
	k, err := w.j.kind()
	if err != nil {
		return err
	}
	if k != '"' {
		return w.value(child, levelDeep)
	}
	limit := 256 // as jsonModel reads it
	if child >= 0 && len(w.tree[child].leaves) > 0 {
		limit = math.MaxInt
	}
	s, err := w.j.stringValue(limit)
	if err != nil {
		return err
	}
	w.model = s[:min(len(s), 256)]
	if child >= 0 {
		return w.found(&w.tree[child], s)
	}
	return nil
}

// leaf reads the value at the end of a path: a string, number or boolean
// is found; null, an object or an array is not.
func (w *fieldWalker) leaf(node *pathNode, k byte) error {
	var s string
	switch k {
	case '"':
		v, err := w.j.stringValue(math.MaxInt)
		if err != nil {
			return err
		}
		s = v
	case 'n':
		b, err := w.j.captureValue(math.MaxInt)
		if err != nil {
			return err
		}
		s = canonicalNumber(string(b))
	case 't', 'f':
		s = "true"
		if k == 'f' {
			s = "false"
		}
		if err := w.j.literal(s); err != nil {
			return err
		}
	default:
		return w.j.skip()
	}
	return w.found(node, s)
}

func (w *fieldWalker) found(node *pathNode, s string) error {
	if w.j.noUTF8Check && !utf8.ValidString(s) {
		return w.j.fail("invalid UTF-8 in string")
	}
	for _, i := range node.leaves {
		if w.vals[i].Found && w.vals[i].S != s {
			// Two requests of a batch with different values: no one key
			// can count the batch.
			return &InvalidError{msg: "the requests of a batch differ in a field a rate-limit key reads", final: true}
		}
		w.vals[i] = Value{S: s, Found: true}
	}
	return nil
}

// canonicalNumber writes a valid JSON number literal in one spelling per
// value, exactly (no float rounding): 7, 7.0, 7e0, 70e-1 and 0.7E1 are all
// "7"; -0 is "0"; 0.5 is "0.5"; 1e300 is "1e300". Without it, every
// spelling of a number in a json: key part would be a fresh budget.
func canonicalNumber(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, expText, _ := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	exp, err := strconv.ParseInt(expText, 10, 64)
	if expText == "" {
		exp, err = 0, nil
	}
	if err != nil || exp > 1<<40 || exp < -(1<<40) {
		if neg { // an absurd exponent: keep the literal (its value is 0 or out of any range)
			return "-" + s
		}
		return s
	}
	// value = digits × 10^e
	digits := strings.TrimLeft(intPart+frac, "0")
	e := exp - int64(len(frac))
	for len(digits) > 0 && digits[len(digits)-1] == '0' {
		digits = digits[:len(digits)-1]
		e++
	}
	if digits == "" {
		return "0"
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	switch pos := int64(len(digits)) + e; {
	case e >= 0 && e <= 20:
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", int(e)))
	case e < 0 && pos > 0:
		b.WriteString(digits[:pos])
		b.WriteByte('.')
		b.WriteString(digits[pos:])
	case e < 0 && pos > -20:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", int(-pos)))
		b.WriteString(digits)
	default:
		b.WriteString(digits)
		b.WriteByte('e')
		b.WriteString(strconv.FormatInt(e, 10))
	}
	return b.String()
}
