package picker

import (
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// creditOneByOne is Credit as it was before runs: every block added, tail first. The run is only a faster way
// to the same state.
func (x *Index) creditOneByOne(endpoint string, hashes []uint64, capacity int) Credited {
	x.mu.Lock()
	defer x.mu.Unlock()
	l := x.lru(endpoint, capacity)
	var c Credited
	if len(hashes) > 0 {
		c.Faded = l.fading(GroupKey(hashes))
	}
	for i, h := range slices.Backward(hashes) {
		if !l.add(h) {
			c.Added++
			if i >= MaxSharedBlocks {
				c.AddedPastShared++
			}
		}
	}
	if len(hashes) > 0 {
		l.markGroup(GroupKey(hashes))
	}
	return c
}

func (x *Index) matchOneByOne(endpoint string, hashes []uint64) int {
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

// Crediting and matching by runs leave every endpoint's LRU exactly as block by block did — order, ages,
// evictions, groups — over random conversations that grow, repeat, interleave, share prefixes and overflow small
// caches, with forgets and churn between them.
func TestIndexRunsMatchBlockByBlock(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	conversations := make([][]uint64, 12)
	for c := range conversations {
		chain := make([]uint64, 60)
		for i := range chain {
			chain[i] = rng.Uint64() | 1 // never the zero hash of an empty slot
			if c > 0 && i < 3 && rng.IntN(3) == 0 {
				chain[i] = conversations[0][i] // a shared system prompt
			}
		}
		if c == 1 { // a repeated hash, which no chained hash makes but the run must survive
			chain[20] = chain[2]
		}
		conversations[c] = chain
	}
	runs, blocks := NewIndex(), NewIndex()
	endpoints := []string{"a", "b", "c"}
	for step := range 20000 {
		ep := endpoints[rng.IntN(len(endpoints))]
		capacity := []int{8, 24, 64}[rng.IntN(3)]
		hashes := conversations[rng.IntN(len(conversations))][:1+rng.IntN(59)]
		switch op := rng.IntN(20); {
		case op == 0:
			h := hashes[rng.IntN(len(hashes))]
			runs.Forget(ep, h)
			blocks.Forget(ep, h)
		case op == 1:
			runs.Churn(ep, 3)
			blocks.Churn(ep, 3)
		default:
			if got, want := runs.Match(ep, hashes), blocks.matchOneByOne(ep, hashes); got != want {
				t.Fatalf("step %d: Match %d, block by block %d", step, got, want)
			}
			if got, want := runs.Credit(ep, hashes, capacity), blocks.creditOneByOne(ep, hashes, capacity); got != want {
				t.Fatalf("step %d: Credit %+v, block by block %+v", step, got, want)
			}
		}
		for _, e := range endpoints {
			a, b := runs.endpoints[e], blocks.endpoints[e]
			if (a == nil) != (b == nil) {
				t.Fatalf("step %d: endpoint %s indexed in one only", step, e)
			}
			if a == nil {
				continue
			}
			if !reflect.DeepEqual(a.slots, b.slots) || a.head != b.head || a.tail != b.tail || a.free != b.free ||
				a.clock != b.clock || a.groups != b.groups || !maps.Equal(a.index, b.index) ||
				!slices.Equal(a.ghosts, b.ghosts) || !maps.Equal(a.ghostAt, b.ghostAt) {
				t.Fatalf("step %d: endpoint %s's LRU differs from block by block", step, e)
			}
		}
	}
}

// BenchmarkIndexRepeatedPrompt is a 512-block prompt (32 KiB) matched and credited again where it was credited
// last, as a conversation's next turn is: the run path. A regression to block-by-block lookups shows here.
//
//	go test ./picker -run '^$' -bench IndexRepeatedPrompt -benchmem
func BenchmarkIndexRepeatedPrompt(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 5))
	hashes := make([]uint64, 512)
	for i := range hashes {
		hashes[i] = rng.Uint64() | 1
	}
	x := NewIndex()
	x.Credit("a", hashes, 32768)
	b.ReportAllocs()
	for b.Loop() {
		if x.Match("a", hashes) != len(hashes) {
			b.Fatal("the prompt is not held")
		}
		x.Credit("a", hashes, 32768)
	}
}
