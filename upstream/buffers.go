package upstream

import "sync"

// bufferPool recycles the 32 KiB body copy buffers: without it every
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

// get and put hand out the buffer by its pointer, so that giving it back
// allocates nothing.
func (b *bufferPool) get() *[]byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return v
	}
	buf := make([]byte, copyBufferSize)
	return &buf
}

func (b *bufferPool) put(v *[]byte) { b.p.Put(v) }
