package picker

import (
	"sync"
)

// DefaultIndexBlocks is an endpoint's index capacity when the engine's num_gpu_blocks is unknown.
const DefaultIndexBlocks = 8192

// Index remembers, per endpoint, which prompt blocks this gateway has sent there: an approximation of each
// replica's prefix KV cache, credited when a request is routed and aged out least recently used, sized like
// the engine's cache.
type Index struct {
	mu        sync.Mutex
	endpoints map[string]*lru
}

// NewIndex creates an empty index.
func NewIndex() *Index { return &Index{endpoints: map[string]*lru{}} }

func (x *Index) lru(endpoint string, capacity int) *lru {
	l, ok := x.endpoints[endpoint]
	if !ok {
		if capacity <= 0 {
			capacity = DefaultIndexBlocks
		}
		l = newLRU(capacity)
		x.endpoints[endpoint] = l
	}
	return l
}

// Match returns how many leading blocks of hashes the endpoint is believed to hold.
func (x *Index) Match(endpoint string, hashes []uint64) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	l, ok := x.endpoints[endpoint]
	if !ok {
		return 0
	}
	for i, h := range hashes {
		if _, ok := l.index[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// Credit records that the endpoint now holds the prompt's blocks; capacity sizes a new endpoint's LRU.
func (x *Index) Credit(endpoint string, hashes []uint64, capacity int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	l := x.lru(endpoint, capacity)
	for _, h := range hashes {
		l.add(h)
	}
}

// lru is a fixed-capacity set of block hashes with least-recently-used eviction, on an intrusive list of
// array slots so that steady-state use allocates nothing.
type lru struct {
	slots      []slot
	index      map[uint64]int32
	head, tail int32 // most and least recently used; -1 when empty
	free       int32 // next unused slot
}

type slot struct {
	hash       uint64
	prev, next int32
}

func newLRU(capacity int) *lru {
	return &lru{slots: make([]slot, capacity), index: make(map[uint64]int32, capacity), head: -1, tail: -1}
}

func (l *lru) unlink(i int32) {
	s := &l.slots[i]
	if s.prev >= 0 {
		l.slots[s.prev].next = s.next
	} else {
		l.head = s.next
	}
	if s.next >= 0 {
		l.slots[s.next].prev = s.prev
	} else {
		l.tail = s.prev
	}
}

func (l *lru) pushFront(i int32) {
	s := &l.slots[i]
	s.prev, s.next = -1, l.head
	if l.head >= 0 {
		l.slots[l.head].prev = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}

// touch marks a hash as used, reporting whether it was present.
func (l *lru) touch(h uint64) bool {
	i, ok := l.index[h]
	if !ok {
		return false
	}
	l.unlink(i)
	l.pushFront(i)
	return true
}

func (l *lru) add(h uint64) {
	if l.touch(h) {
		return
	}
	var i int32
	if int(l.free) < len(l.slots) {
		i = l.free
		l.free++
	} else {
		i = l.tail
		l.unlink(i)
		delete(l.index, l.slots[i].hash)
	}
	l.slots[i].hash = h
	l.index[h] = i
	l.pushFront(i)
}
