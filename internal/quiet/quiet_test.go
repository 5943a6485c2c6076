//go:build linux

package quiet_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/quiet"
)

// quietPair is a loopback TCP connection, both ends made quiet.
func quietPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		got <- c
	}()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := <-got
	if c == nil {
		t.Fatal("accept failed")
	}
	a, b = quiet.Conn(d), quiet.Conn(c)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestQuietConnCarriesBytes: more than the socket buffers hold, written
// at once to a reader that reads slowly (the writer waits on the poller
// for room), arrives whole and in order; then CloseWrite is EOF.
func TestQuietConnCarriesBytes(t *testing.T) {
	a, b := quietPair(t)
	want := make([]byte, 8<<20)
	rand.Read(want)
	errc := make(chan error, 1)
	go func() {
		n, err := a.Write(want)
		if err == nil && n != len(want) {
			err = io.ErrShortWrite
		}
		if err == nil {
			err = a.(interface{ CloseWrite() error }).CloseWrite()
		}
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond) // the writer fills the buffers first
	var got bytes.Buffer
	buf := make([]byte, 1000)
	for {
		n, err := b.Read(buf)
		got.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("read %d bytes, not the %d written", got.Len(), len(want))
	}
	if n, err := b.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("read after EOF: %d, %v", n, err)
	}
}

// TestQuietConnDeadlinesAndClose: a read deadline ends a waiting read with
// a timeout net.Error; a Close from another goroutine ends it with
// net.ErrClosed; writing to a peer that reset is an error, not a signal.
func TestQuietConnDeadlinesAndClose(t *testing.T) {
	a, b := quietPair(t)
	a.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := a.Read(make([]byte, 10))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past its deadline: %v, want a timeout", err)
	}
	a.SetReadDeadline(time.Time{})

	done := make(chan error, 1)
	go func() {
		_, err := a.Read(make([]byte, 10))
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	a.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read on a closed connection: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a waiting read")
	}

	// b's peer is gone: a write fails with EPIPE or ECONNRESET, as an
	// *net.OpError, within a few tries.
	var werr error
	for i := 0; i < 100 && werr == nil; i++ {
		_, werr = b.Write([]byte("after the peer closed"))
		time.Sleep(time.Millisecond)
	}
	var op *net.OpError
	if !errors.As(werr, &op) || !(errors.Is(werr, syscall.EPIPE) || errors.Is(werr, syscall.ECONNRESET)) {
		t.Fatalf("write to a closed peer: %v, want an OpError for EPIPE or ECONNRESET", werr)
	}
}

// TestQuietKeepsOtherConnections: what is not a TCP connection is
// returned as it is, and a quiet one still offers its syscall.RawConn (the
// pool's liveness peek uses it).
func TestQuietKeepsOtherConnections(t *testing.T) {
	p, q := net.Pipe()
	defer p.Close()
	defer q.Close()
	if quiet.Conn(p) != p {
		t.Fatal("a pipe was wrapped")
	}
	a, _ := quietPair(t)
	if _, ok := a.(syscall.Conn); !ok {
		t.Fatal("a quiet connection hides its syscall.RawConn")
	}
}
