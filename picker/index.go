package picker

import "sync"

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
	if capacity <= 0 {
		capacity = DefaultIndexBlocks
	}
	l, ok := x.endpoints[endpoint]
	switch {
	case !ok:
		l = newLRU(capacity)
		x.endpoints[endpoint] = l
	case capacityMoved(len(l.slots), capacity):
		// The engine reported its real KV capacity (or a restart changed it): keep the most recent blocks.
		l = l.resized(capacity)
		x.endpoints[endpoint] = l
	}
	return l
}

// capacityMoved reports a capacity far enough from an LRU's to resize it. The capacity asked for is the
// engine's block count times the estimated ÷ real token ratio, which moves a little with every response, and a
// resize copies the whole LRU (and resets its blocks' ages): resizing on every wobble did so on three decisions
// in four. A change of more than 1/32 is a real one: a new engine reading, or the ratio learnt.
func capacityMoved(have, want int) bool {
	d := want - have
	return d > have/32 || -d > have/32
}

// Retain forgets every endpoint keep rejects — replicas gone from the policy — so that their memory is freed
// and a replica that comes back under the same address starts cold, as its engine does.
func (x *Index) Retain(keep func(endpoint string) bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for ep := range x.endpoints {
		if !keep(ep) {
			delete(x.endpoints, ep)
		}
	}
}

// Forget removes one block from what an endpoint is believed to hold; forgetting a prompt's first block
// unmatches every prompt that starts with it.
func (x *Index) Forget(endpoint string, hash uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if l, ok := x.endpoints[endpoint]; ok {
		l.remove(hash)
	}
}

// Capacity reports an endpoint's index size in blocks (0 when the endpoint is not indexed).
func (x *Index) Capacity(endpoint string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if l, ok := x.endpoints[endpoint]; ok {
		return len(l.slots)
	}
	return 0
}

// Match returns how many leading blocks of hashes the endpoint is believed to hold.
func (x *Index) Match(endpoint string, hashes []uint64) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	l, ok := x.endpoints[endpoint]
	if !ok {
		return 0
	}
	run, _ := l.headRun(hashes) // held, without looking each up
	for i, h := range hashes[run:] {
		if _, ok := l.index[h]; !ok {
			return run + i
		}
	}
	return len(hashes)
}

// Credited is what crediting a prompt to an endpoint found.
type Credited struct {
	// Added counts the prompt's blocks that were not held: what this use added to the engine's cache.
	// AddedPastShared counts those of them past the first MaxSharedBlocks, which a placement does not carry.
	Added, AddedPastShared int
	// Faded reports that the prompt's group block was held but had aged towards eviction (see lru.fading).
	Faded bool
}

// Credit records that the endpoint now holds the prompt's blocks; capacity sizes a new endpoint's LRU. The
// prompt's group block (see GroupKey) counts towards the endpoint's Groups while the index keeps it.
func (x *Index) Credit(endpoint string, hashes []uint64, capacity int) Credited {
	x.mu.Lock()
	defer x.mu.Unlock()
	l := x.lru(endpoint, capacity)
	var c Credited
	if len(hashes) > 0 {
		c.Faded = l.fading(GroupKey(hashes))
	}
	// Tail first, as vLLM frees a finished request's blocks: the prompt's first block becomes the most recently
	// used, so the index, like the engine, loses the end of a prefix before its beginning (Match counts from
	// the first block; a lost head would unmatch the whole group while the engine still serves it).
	// The leading blocks that already open the list in order (a prompt repeated here) are touched as one run.
	run, first := l.headRun(hashes)
	added := func(i int, h uint64) {
		if !l.add(h) {
			c.Added++
			if i >= MaxSharedBlocks {
				c.AddedPastShared++
			}
		}
	}
	for i := len(hashes) - 1; i >= run; i-- {
		added(i, hashes[i])
	}
	if run > 0 && !l.touchRun(first, hashes[:run]) {
		for i := run - 1; i >= 0; i-- {
			added(i, hashes[i])
		}
	}
	if len(hashes) > 0 {
		l.markGroup(GroupKey(hashes))
	}
	return c
}

// Churn ages an indexed endpoint's LRU by blocks the engine cached for prompts this replica has not seen
// (another replica's, see Placement.Churn): that many blocks no prompt matches are added as the most recently
// used, pushing out the least recently used as the engine's cache does. An endpoint not indexed is left alone.
func (x *Index) Churn(endpoint string, blocks int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	l, ok := x.endpoints[endpoint]
	if !ok {
		return
	}
	for range min(blocks, len(l.slots)) {
		l.addUnmatched()
	}
}

// Groups reports how many conversation groups the endpoint is believed to hold: what new groups are balanced
// on, so that every gateway replica, having seen the same groups, places the next one alike.
func (x *Index) Groups(endpoint string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if l, ok := x.endpoints[endpoint]; ok {
		return l.groups
	}
	return 0
}

// AgedOut reports whether the index held the group (named by its group block, see GroupKey) at endpoint until
// its LRU aged it out. The index ages with this replica's view of the traffic, the engine's cache with every
// replica's, so a group in use elsewhere is often still there: placing it again where it was costs nothing if
// so, and keeps the fleet from making a second copy.
func (x *Index) AgedOut(endpoint string, group uint64) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	l, ok := x.endpoints[endpoint]
	if !ok {
		return false
	}
	_, ok = l.ghostAt[group]
	return ok
}

// GroupKey is the chained hash that names a prompt's conversation group: that of its first rendezvousBlocks
// blocks (or of all of them when the prompt is shorter).
func GroupKey(hashes []uint64) uint64 { return hashes[min(len(hashes), rendezvousBlocks)-1] }

// lru is a fixed-capacity set of block hashes with least-recently-used eviction, on an intrusive list of
// array slots so that steady-state use allocates nothing.
type lru struct {
	slots      []slot
	index      map[uint64]int32
	head, tail int32  // most and least recently used; -1 when empty
	free       int32  // next unused slot
	groups     int    // slots marked group
	clock      uint64 // counts uses (adds and touches), for slots' ages
	// ghosts are the groups this LRU aged out most recently (their group blocks), in a ring: the engine,
	// whose cache every replica's requests keep fresh, may well still hold them (see Index.AgedOut).
	ghosts    []uint64
	ghostNext int
	ghostAt   map[uint64]int // a remembered group block's place in the ring
}

type slot struct {
	hash       uint64
	used       uint64 // the lru's clock at this block's last use
	prev, next int32
	group      bool // the block that names a conversation group (its rendezvous key)
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
	l.clock++
	l.slots[i].used = l.clock
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

// headRun counts the leading hashes that open the list, in order — held, and the most recently used — by
// walking the list instead of looking each up; first is the run's first slot. (A slot holding no block has
// hash 0, so a zero hash ends the run.)
func (l *lru) headRun(hashes []uint64) (n int, first int32) {
	i := l.head
	for n < len(hashes) && i >= 0 && hashes[n] != 0 && l.slots[i].hash == hashes[n] {
		i = l.slots[i].next
		n++
	}
	return n, l.head
}

// touchRun touches the run of hashes that starts at slot first, last hash first, as that many touches would:
// the run moves to the front in its order and each block's use is stamped. It reports false, changing
// nothing, when the run is no longer whole (a block of it was evicted or moved since headRun).
func (l *lru) touchRun(first int32, hashes []uint64) bool {
	last := first
	for k, h := range hashes {
		if last < 0 || l.slots[last].hash != h {
			return false
		}
		if k < len(hashes)-1 {
			next := l.slots[last].next
			if next < 0 || l.slots[next].prev != last {
				return false
			}
			last = next
		}
	}
	for k, i := 0, first; k < len(hashes); k, i = k+1, l.slots[i].next {
		l.slots[i].used = l.clock + uint64(len(hashes)-k)
	}
	l.clock += uint64(len(hashes))
	if first == l.head {
		return true
	}
	prev, next := l.slots[first].prev, l.slots[last].next
	l.slots[prev].next = next // first is not the head, so it has a prev
	if next >= 0 {
		l.slots[next].prev = prev
	} else {
		l.tail = prev
	}
	l.slots[first].prev, l.slots[last].next = -1, l.head
	l.slots[l.head].prev = last
	l.head = first
	return true
}

// fading reports whether a held block is in the older part of the LRU: more uses have passed since its last
// one than fadingAge of those since the least recently used block's (scaled up by how much of the LRU is
// still unused, while it fills). It is what eviction comes to next.
func (l *lru) fading(h uint64) bool {
	i, ok := l.index[h]
	if !ok || l.tail < 0 || l.free == 0 {
		return false
	}
	span := float64(l.clock - l.slots[l.tail].used)
	if n := int(l.free); n < len(l.slots) {
		span *= float64(len(l.slots)) / float64(n) // the tail goes only once the free slots are used
	}
	return span > 0 && float64(l.clock-l.slots[i].used) >= fadingAge*span
}

// fadingAge is how far towards eviction a block has aged when fading reports it.
const fadingAge = 0.5

// remove drops a hash; its slot goes to the tail, to be reused first.
func (l *lru) remove(h uint64) {
	i, ok := l.index[h]
	if !ok {
		return
	}
	delete(l.index, h)
	l.unlink(i)
	l.ungroup(i)
	// Keep the slot in the list as the least recently used, holding a hash no prompt can match again soon.
	l.slots[i].hash = 0
	s := &l.slots[i]
	s.next, s.prev = -1, l.tail
	if l.tail >= 0 {
		l.slots[l.tail].next = i
	} else {
		l.head = i
	}
	l.tail = i
}

// resized copies the most recently used entries into an LRU of another capacity. What it had aged out, and the
// groups the new capacity leaves out, are remembered as aged out (Index.AgedOut).
func (l *lru) resized(capacity int) *lru {
	n := newLRU(capacity)
	var recent, dropped []int32
	for i := l.head; i >= 0; i = l.slots[i].next {
		if j, ok := l.index[l.slots[i].hash]; !ok || j != i { // skip removed slots
			continue
		}
		if len(recent) < capacity {
			recent = append(recent, i)
		} else if l.slots[i].group {
			dropped = append(dropped, i)
		}
	}
	for k := len(recent) - 1; k >= 0; k-- { // oldest first, so the newest ends up most recent
		s := l.slots[recent[k]]
		n.add(s.hash)
		if s.group {
			n.markGroup(s.hash)
		}
	}
	for k := range l.ghosts { // the ring from its oldest entry
		at := (l.ghostNext + k) % len(l.ghosts)
		if h := l.ghosts[at]; l.remembers(h, at) {
			n.ghost(h)
		}
	}
	for k := len(dropped) - 1; k >= 0; k-- { // then the groups left out, least recently used first
		n.ghost(l.slots[dropped[k]].hash)
	}
	return n
}

// markGroup marks a held block as the one naming a conversation group.
func (l *lru) markGroup(h uint64) {
	if i, ok := l.index[h]; ok && !l.slots[i].group {
		l.slots[i].group = true
		l.groups++
		delete(l.ghostAt, h) // held again; its ring entry is overwritten in turn
	}
}

// ghost remembers a group block aged out, forgetting the oldest past the ring's size.
func (l *lru) ghost(h uint64) {
	if l.ghosts == nil {
		l.ghosts = make([]uint64, max(minGhosts, len(l.slots)/blocksPerGhost))
		l.ghostAt = make(map[uint64]int, len(l.ghosts))
	}
	if _, ok := l.ghostAt[h]; ok {
		return
	}
	// The entry overwritten goes, unless its group was held and aged out again since: then it stands later in
	// the ring.
	if old := l.ghosts[l.ghostNext]; l.remembers(old, l.ghostNext) {
		delete(l.ghostAt, old)
	}
	l.ghosts[l.ghostNext] = h
	l.ghostAt[h] = l.ghostNext
	l.ghostNext = (l.ghostNext + 1) % len(l.ghosts)
}

// remembers reports whether the ring's entry at is the live one for group h (not one overwritten later, nor a
// group held again).
func (l *lru) remembers(h uint64, at int) bool {
	p, ok := l.ghostAt[h]
	return ok && p == at
}

// minGhosts and blocksPerGhost size an LRU's ring of aged-out groups: one per 16 blocks of capacity, at least
// 64 (8 bytes each, twice).
const (
	minGhosts      = 64
	blocksPerGhost = 16
)

func (l *lru) ungroup(i int32) {
	if l.slots[i].group {
		l.slots[i].group = false
		l.groups--
	}
}

// add uses a block, reporting whether it was held already.
func (l *lru) add(h uint64) bool {
	if l.touch(h) {
		return true
	}
	i := l.take()
	l.slots[i].hash = h
	l.index[h] = i
	l.pushFront(i)
	return false
}

// addUnmatched takes the most recently used place with a block no prompt matches (not in the index).
func (l *lru) addUnmatched() {
	i := l.take()
	l.slots[i].hash = 0
	l.pushFront(i)
}

// take returns an unlinked slot: an unused one, else the least recently used, evicted.
func (l *lru) take() int32 {
	var i int32
	if int(l.free) < len(l.slots) {
		i = l.free
		l.free++
	} else {
		i = l.tail
		l.unlink(i)
		if j, ok := l.index[l.slots[i].hash]; ok && j == i {
			delete(l.index, l.slots[i].hash)
		}
		if l.slots[i].group {
			l.ghost(l.slots[i].hash)
		}
		l.ungroup(i)
	}
	return i
}
