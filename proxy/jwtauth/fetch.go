package jwtauth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// source is where the key set comes from: a file or a URL.
type source struct {
	file   bool
	where  string // the path, or the URL as it may be logged (no userinfo, no query)
	path   string
	url    string
	client *http.Client
}

func newSource(jwks string, client *http.Client) (*source, error) {
	if !strings.Contains(jwks, "://") {
		return &source{file: true, where: jwks, path: jwks}, nil
	}
	u, err := url.Parse(jwks)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, errors.New("jwtauth: the key set is an https:// URL or a file path")
	}
	if client == nil {
		client = &http.Client{Timeout: fetchTimeout, CheckRedirect: noDowngrade}
	}
	shown := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
	return &source{where: shown.String(), url: jwks, client: client}, nil
}

// noDowngrade follows at most 10 redirects, none from https to http.
func noDowngrade(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if req.URL.Scheme != "https" && via[0].URL.Scheme == "https" {
		return errors.New("redirect from https to http refused")
	}
	return nil
}

// read returns the key-set document, at most MaxKeySetBytes of it.
func (s *source) read(ctx context.Context) ([]byte, error) {
	var body io.Reader
	if s.file {
		f, err := os.Open(s.path)
		if err != nil {
			return nil, bare(err)
		}
		defer f.Close()
		body = f
	} else {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
		if err != nil {
			return nil, errors.New("bad key-set URL")
		}
		req.Header.Set("Accept", "application/jwk-set+json, application/json")
		resp, err := s.client.Do(req)
		if err != nil {
			return nil, bare(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("status %d", resp.StatusCode)
		}
		body = resp.Body
	}
	data, err := io.ReadAll(io.LimitReader(body, MaxKeySetBytes+1))
	if err != nil {
		return nil, bare(err)
	}
	if len(data) > MaxKeySetBytes {
		return nil, fmt.Errorf("key set larger than %d bytes", MaxKeySetBytes)
	}
	return data, nil
}

// bare drops the URL (whose query may hold a credential) or the path (which
// the caller names once) from err.
func bare(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// fetch loads the key set once and, when it parses, makes it current. why
// is for the log: start, refresh or unknown kid.
func (v *Verifier) fetch(ctx context.Context, why string) error {
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	seq := v.seq.Add(1)
	data, err := v.src.read(ctx)
	var set *keySet
	var skipped skips
	if err == nil {
		set, skipped, err = parseKeySet(data)
	}
	if err != nil {
		if v.onFetch != nil {
			v.onFetch(false)
		}
		if v.src.file {
			err = fmt.Errorf("jwtauth: key set file %s: %w", v.src.where, err)
		} else {
			err = fmt.Errorf("jwtauth: key set %s: %w", v.src.where, err)
		}
		switch {
		case why == "start" && v.src.file:
			// New returns the error
		case v.keys.Load() != nil:
			v.log.Warn("jwt key set not loaded; keeping the last good one", "jwks", v.src.where, "reason", why, "err", err)
		default:
			v.log.Warn("jwt key set not loaded; no RS*, PS*, ES* or EdDSA token verifies until it is", "jwks", v.src.where, "reason", why, "err", err)
		}
		return err
	}
	set.seq = seq
	for {
		cur := v.keys.Load()
		if cur != nil && cur.seq > seq {
			break // a later fetch already finished
		}
		if v.keys.CompareAndSwap(cur, set) {
			break
		}
	}
	// Told only now, so that whoever hears "ok" finds the keys in place.
	if v.onFetch != nil {
		v.onFetch(true)
	}
	level := v.log.Debug
	if why != "refresh" {
		level = v.log.Info
	}
	level("jwt key set loaded", "jwks", v.src.where, "reason", why, "keys", len(set.keys))
	if skipped.n > 0 {
		v.log.Warn("jwt key set: keys skipped", "jwks", v.src.where, "skipped", skipped.n, "first", skipped.first)
	}
	return nil
}

// loop fetches the key set every refresh, sooner while none was ever loaded.
func (v *Verifier) loop() {
	defer v.wg.Done()
	t := time.NewTimer(v.period())
	defer t.Stop()
	for {
		select {
		case <-v.ctx.Done():
			return
		case <-t.C:
			v.fetch(v.ctx, "refresh")
			t.Reset(v.period())
		}
	}
}

func (v *Verifier) period() time.Duration {
	if v.keys.Load() == nil {
		return min(v.refresh, retryUnloaded)
	}
	return v.refresh
}

// refetchUnknown fetches the key set for a token naming an unknown kid,
// unless such a fetch started less than a minute ago; concurrent callers
// share one fetch. It returns when the fetch ends or ctx does.
func (v *Verifier) refetchUnknown(ctx context.Context) {
	v.mu.Lock()
	done := v.inflight
	if done == nil {
		now := v.now()
		if v.closed {
			v.mu.Unlock()
			return
		}
		if d := now.Sub(v.lastUnknown); v.refetched && d >= 0 && d < unknownKIDWait {
			v.mu.Unlock()
			return
		}
		v.lastUnknown, v.refetched = now, true
		done = make(chan struct{})
		v.inflight = done
		v.wg.Add(1)
		go func() {
			defer v.wg.Done()
			v.fetch(v.ctx, "unknown kid")
			v.mu.Lock()
			v.inflight = nil
			v.mu.Unlock()
			close(done)
		}()
	}
	v.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
