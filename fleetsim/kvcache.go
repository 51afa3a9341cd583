package fleetsim

import (
	"container/list"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// kvCache is a replica's block-level prefix cache, shaped like vLLM's: fixed-size blocks of tokens, a block
// identified by the hash chain of every token before and in it, blocks held by running sequences pinned, and
// free cached blocks evicted least recently used first. Only full prompt blocks are cached.
type kvCache struct {
	blockSize int
	capacity  int // blocks
	used      int // blocks held by running sequences (hashed and private)
	blocks    map[uint64]*cachedBlock
	lru       *list.List // of *cachedBlock with refs == 0, oldest first
}

type cachedBlock struct {
	hash     uint64
	refs     int
	computed bool // its KV exists: a sequence finished prefilling it
	elem     *list.Element
}

func newKVCache(blockSize, capacity int) *kvCache {
	return &kvCache{blockSize: blockSize, capacity: capacity, blocks: map[uint64]*cachedBlock{}, lru: list.New()}
}

// blockHashes chains the hashes of the prompt's full blocks.
func blockHashes(tokens []string, blockSize int) []uint64 {
	n := len(tokens) / blockSize
	out := make([]uint64, n)
	var prev uint64
	d := xxhash.New()
	for i := range n {
		d.Reset()
		var seed [8]byte
		for b := range 8 {
			seed[b] = byte(prev >> (8 * b))
		}
		_, _ = d.Write(seed[:])
		_, _ = d.WriteString(strings.Join(tokens[i*blockSize:(i+1)*blockSize], " "))
		prev = d.Sum64()
		out[i] = prev
	}
	return out
}

// matched counts the leading blocks whose KV is in the cache.
func (c *kvCache) matched(hashes []uint64) int {
	for i, h := range hashes {
		if b, ok := c.blocks[h]; !ok || !b.computed {
			return i
		}
	}
	return len(hashes)
}

// markComputed records that a sequence's prefill produced its prompt blocks.
func (c *kvCache) markComputed(hashes []uint64) {
	for _, h := range hashes {
		if b, ok := c.blocks[h]; ok {
			b.computed = true
		}
	}
}

// free is how many blocks can be handed out now, evicting cached blocks nobody holds.
func (c *kvCache) free() int { return c.capacity - c.used }

// allocate pins the prompt's cached prefix, caches its other full blocks and reserves private blocks, if the
// cache can hold them all; otherwise it changes nothing and returns false (the request waits: the KV wall).
func (c *kvCache) allocate(hashes []uint64, private int) (cachedBlocks int, ok bool) {
	hit := c.matched(hashes)
	// A block already present is shared (pinning a free one moves it from evictable to used); others are new.
	need := private
	for _, h := range hashes {
		if b, ok := c.blocks[h]; !ok || b.refs == 0 {
			need++
		}
	}
	if need > c.free() {
		return 0, false
	}
	for _, h := range hashes {
		b, ok := c.blocks[h]
		if !ok {
			c.makeRoom(1)
			b = &cachedBlock{hash: h}
			c.blocks[h] = b
		}
		c.pin(b)
	}
	c.makeRoom(private)
	c.used += private
	return hit, true
}

func (c *kvCache) pin(b *cachedBlock) {
	if b.refs == 0 {
		if b.elem != nil {
			c.lru.Remove(b.elem)
			b.elem = nil
		}
		c.used++
	}
	b.refs++
}

// makeRoom evicts least recently used free blocks until n more blocks fit.
func (c *kvCache) makeRoom(n int) {
	for c.used+c.lru.Len()+n > c.capacity && c.lru.Len() > 0 {
		b := c.lru.Remove(c.lru.Front()).(*cachedBlock)
		delete(c.blocks, b.hash)
	}
}

// release returns a finished sequence's blocks; its prompt blocks stay cached until evicted. As vLLM does, they
// go back tail first, so the prompt's head becomes the most recently used and is evicted last: a shared
// system prompt outlives the questions that followed it, and a cache under pressure loses the end of a prefix
// before its beginning (a prefix is matched from the first block).
func (c *kvCache) release(hashes []uint64, private int) {
	c.used -= private
	for _, h := range slices.Backward(hashes) {
		b := c.blocks[h]
		b.refs--
		if b.refs == 0 {
			c.used--
			b.elem = c.lru.PushBack(b)
		}
	}
}

// insert caches blocks as computed and unpinned (most recently used), evicting to make room: KV cache that
// arrived from elsewhere. Blocks already present are left as they are.
func (c *kvCache) insert(hashes []uint64) {
	for _, h := range hashes {
		if b, ok := c.blocks[h]; ok {
			b.computed = true
			continue
		}
		c.makeRoom(1)
		if c.used+c.lru.Len() >= c.capacity {
			return // every block is pinned by running sequences: nothing more fits
		}
		b := &cachedBlock{hash: h, computed: true}
		b.elem = c.lru.PushBack(b)
		c.blocks[h] = b
	}
}

// usage is the fraction of blocks held by running sequences, as vllm:kv_cache_usage_perc reports it.
func (c *kvCache) usage() float64 { return float64(c.used) / float64(c.capacity) }
