package extproc

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
)

// Buffer tiers: 256 B to 16 MiB. Larger messages are allocated and dropped.
const (
	minBufExp = 8
	maxBufExp = 24
)

// BufferPool is a grpc mem.BufferPool with a tier for every power of two, that does not zero buffers on reuse.
// grpc-go's default pool jumps from 32 KiB to 1 MiB buffers and zeroes the whole buffer on every Get, so each
// 40 KiB-1 MiB prompt message cost a 1 MiB memclr; here a message costs at most 2x its size and no clearing.
// gRPC overwrites every byte it hands out (it reads len(buf) bytes into it or encodes into it), so the
// zeroing only guarded against gRPC's own bugs.
type BufferPool struct {
	tiers [maxBufExp + 1]sync.Pool
}

var _ mem.BufferPool = (*BufferPool)(nil)

// InstallBufferPool makes a BufferPool grpc-go's process-wide default. The proto codec takes its marshal and
// unmarshal buffers from the default pool whatever the server options say, so the server option alone does not
// reach the largest copies. Call it once at start-up, before any gRPC traffic.
func InstallBufferPool() {
	experimental.SetDefaultBufferPool(sharedBufferPool)
}

// Get returns a buffer of length n.
func (p *BufferPool) Get(n int) *[]byte {
	e := max(bits.Len(uint(max(n, 1)-1)), minBufExp)
	if e > maxBufExp {
		b := make([]byte, n)
		return &b
	}
	if v, ok := p.tiers[e].Get().(*[]byte); ok {
		*v = (*v)[:n]
		return v
	}
	b := make([]byte, n, 1<<e)
	return &b
}

// Put returns a buffer obtained from Get.
func (p *BufferPool) Put(b *[]byte) {
	c := cap(*b)
	if c == 0 || c&(c-1) != 0 {
		return
	}
	if e := bits.Len(uint(c)) - 1; e >= minBufExp && e <= maxBufExp {
		p.tiers[e].Put(b)
	}
}
