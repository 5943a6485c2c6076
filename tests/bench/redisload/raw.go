package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/limits"
)

// rawWorkers returns callers that each own one TCP connection and send the
// store's EVALSHA by hand: the same keys (limits' naming: prefix{rule|key}:w
// and :l) and arguments as (*Redis).Decide, without go-redis, its pool, the
// context deadline or the store. It is a diagnosis, not a client to ship.
func rawWorkers(cfg config, rule *limits.Rule, names []string, sha string) (func(context.Context, int, func() bool) result, func(), error) {
	conns := make([]net.Conn, cfg.c)
	var mu sync.Mutex
	stop := func() {
		mu.Lock()
		defer mu.Unlock()
		for i, c := range conns {
			if c != nil {
				c.Close()
				conns[i] = nil
			}
		}
	}
	for i := range conns {
		c, err := net.DialTimeout("tcp", cfg.addr, time.Second)
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("dial %s: %w", cfg.addr, err)
		}
		conns[i] = c
	}
	// The request up to the keys, and after them, are the same for every call.
	// limits/redis.lua's arguments for one sliding-window hit: count, now
	// (0: Redis's clock), mode (decide), max slots, pending marks (none: a
	// single server) and their lifetime, then the hit's algorithm, limit,
	// window (µs) and cost.
	head := []byte("*15\r\n$7\r\nEVALSHA\r\n$40\r\n" + sha + "\r\n$1\r\n2\r\n")
	tail := []byte(bulk("1") + bulk("0") + bulk("0") + bulk("1000") + bulk("0") + bulk("0") + bulk("w") +
		bulk(strconv.FormatInt(rule.Limit, 10)) + bulk(strconv.FormatInt(rule.Window.Microseconds(), 10)) + bulk("1"))
	ws := make([]string, len(names))
	ls := make([]string, len(names))
	for i, s := range names {
		base := cfg.prefix + "{" + rule.Name + "|" + limits.KeyOf("caller", s).String() + "}"
		ws[i], ls[i] = bulk(base+":w"), bulk(base+":l")
	}
	per := cfg.n/cfg.c + 1
	worker := func(_ context.Context, id int, next func() bool) result {
		rng := rand.New(rand.NewPCG(uint64(id)+1, 0x9e3779b97f4a7c15))
		r := result{lat: make([]time.Duration, 0, 2*per)}
		mu.Lock()
		conn := conns[id]
		mu.Unlock()
		rd := bufio.NewReaderSize(conn, 4096)
		buf := make([]byte, 0, 512)
		for next() {
			k := rng.IntN(len(names))
			buf = append(append(append(append(buf[:0], head...), ws[k]...), ls[k]...), tail...)
			t0 := time.Now()
			_ = conn.SetDeadline(t0.Add(cfg.timeout))
			allowed, err := roundTrip(conn, rd, buf)
			r.lat = append(r.lat, time.Since(t0))
			switch {
			case err != nil:
				r.errors++
				if r.firstErr == nil {
					r.firstErr = err
				}
				return r // the connection's stream is no longer in step
			case allowed:
				r.allowed++
			default:
				r.refused++
			}
		}
		return r
	}
	return worker, stop, nil
}

func bulk(s string) string { return "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n" }

// roundTrip writes req and reads the script's reply: one string of
// doubles whose first is 1 when the batch was admitted.
func roundTrip(conn net.Conn, rd *bufio.Reader, req []byte) (bool, error) {
	if _, err := conn.Write(req); err != nil {
		return false, err
	}
	line, err := rd.ReadSlice('\n')
	if err != nil {
		return false, err
	}
	if len(line) < 4 || line[0] != '$' {
		return false, fmt.Errorf("unexpected reply %q", line)
	}
	n, err := strconv.Atoi(string(line[1 : len(line)-2]))
	if err != nil || n < 16 || n%8 != 0 {
		return false, fmt.Errorf("unexpected reply %q", line)
	}
	var first [8]byte
	if _, err := io.ReadFull(rd, first[:]); err != nil {
		return false, err
	}
	if _, err := rd.Discard(n - 8); err != nil {
		return false, err
	}
	if end, err := rd.Peek(2); err != nil || end[0] != '\r' || end[1] != '\n' {
		return false, errors.New("unexpected end of reply")
	}
	rd.Discard(2)
	return math.Float64frombits(binary.LittleEndian.Uint64(first[:])) == 1, nil
}
