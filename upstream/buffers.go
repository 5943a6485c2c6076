package upstream

import "sync"

// bufferPool recycles ReverseProxy's 32 KiB copy buffers: without it every
// forwarded response allocates one, and the garbage collector's work grows
// with traffic.
type bufferPool struct{ p sync.Pool }

const copyBufferSize = 32 << 10

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, copyBufferSize)
}

func (b *bufferPool) Put(buf []byte) {
	if cap(buf) != copyBufferSize {
		return
	}
	b.p.Put(&buf)
}
