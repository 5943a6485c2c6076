package limits

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed samples.lua
var samplesScript string

// SharedSamples shares the last values seen under each name between the
// instances of one Redis (the outputs a model wrote, for
// OUTPUT_TOKEN_RESERVE = "learned"): Add buffers a value here, and Sync
// sends what was buffered and reads back every name's last Window values
// in one script call, so each instance learns from every instance's
// answers and a new one starts from what the others learned. The buffer
// is bounded (Window values a name, Names names), and so is Redis:
// Window values a name (about 10 bytes each), Names names, each sample
// expiring a week after its last value.
type SharedSamples struct {
	client  redis.UniversalClient
	key     string
	script  *redis.Script
	window  int
	names   int
	timeout time.Duration

	mu      sync.Mutex
	pending map[string][]int64
	order   []string // pending's names in their first value's order
}

// SharedSamplesOptions configure NewSharedSamples.
type SharedSamplesOptions struct {
	Client  redis.UniversalClient
	Prefix  string        // the instances' key prefix (REDIS_PREFIX)
	Name    string        // the kind of sample: its keys are Prefix{Name}:…
	Window  int           // values kept per name
	Names   int           // most names
	Timeout time.Duration // of one Sync; 1 s when 0
}

// sampleTTL is how long a sample nobody adds to is kept.
const sampleTTL = 7 * 24 * time.Hour

// NewSharedSamples returns the shared samples o names.
func NewSharedSamples(o SharedSamplesOptions) *SharedSamples {
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	return &SharedSamples{client: o.Client, key: o.Prefix + "{" + o.Name + "}:names", script: redis.NewScript(samplesScript),
		window: max(o.Window, 1), names: max(o.Names, 1), timeout: o.Timeout, pending: map[string][]int64{}}
}

// Add buffers v under name until the next Sync, which sends the newest
// Window of them (the buffer holds at most twice that); past Names names
// a new name is not kept.
func (s *SharedSamples) Add(name string, v int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pending[name]
	if !ok {
		if len(s.pending) >= s.names {
			return
		}
		s.order = append(s.order, name)
	}
	if len(p) == 2*s.window {
		// Keep the newest Window: one move per Window values added,
		// not one per value.
		p = append(p[:0], p[s.window:]...)
	}
	s.pending[name] = append(p, v)
}

// Sync sends the buffered values and returns every name's last values,
// oldest first. On failure what was buffered is kept for the next Sync
// (at most Window values a name).
func (s *SharedSamples) Sync(ctx context.Context) (map[string][]int64, error) {
	s.mu.Lock()
	pending, order := s.pending, s.order
	s.pending, s.order = map[string][]int64{}, nil
	s.mu.Unlock()
	args := []any{s.window, sampleTTL.Milliseconds(), s.names}
	for _, name := range order {
		vs := pending[name]
		vs = vs[max(len(vs)-s.window, 0):]
		args = append(args, name, len(vs))
		for _, v := range vs {
			args = append(args, v)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	reply, err := s.script.Run(ctx, s.client, []string{s.key}, args...).Slice()
	if err != nil {
		s.restore(pending, order)
		return nil, fmt.Errorf("shared samples: %w", err)
	}
	out := make(map[string][]int64, len(reply)/2)
	for i := 0; i+1 < len(reply); i += 2 {
		name, _ := reply[i].(string)
		raw, _ := reply[i+1].([]any)
		vs := make([]int64, 0, len(raw))
		for _, x := range raw {
			str, _ := x.(string)
			if v, err := strconv.ParseInt(str, 10, 64); err == nil {
				vs = append(vs, v)
			}
		}
		out[name] = vs
	}
	return out, nil
}

// restore puts back values a failed Sync did not send, before what was
// added meanwhile, within the bounds.
func (s *SharedSamples) restore(pending map[string][]int64, order []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range order {
		newer, ok := s.pending[name]
		if !ok {
			if len(s.pending) >= s.names {
				continue
			}
			s.order = append(s.order, name)
		}
		all := append(pending[name], newer...)
		if len(all) > s.window {
			all = all[len(all)-s.window:]
		}
		s.pending[name] = all
	}
}
