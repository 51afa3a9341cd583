package quota

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/test/redistest"
	"github.com/infergate/infergate/test/wait"
)

// node is a direct connection to one cluster node, for the operator's side of a resharding.
type node struct {
	srv *redistest.Server
	c   *redis.Client
	id  string
}

func dialNode(t *testing.T, srv *redistest.Server) node {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	id, err := c.Do(context.Background(), "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	return node{srv: srv, c: c, id: id}
}

// do runs an admin command that must succeed.
func (n node) do(t *testing.T, args ...any) any {
	t.Helper()
	v, err := n.c.Do(context.Background(), args...).Result()
	if err != nil {
		t.Fatalf("%s %v: %v", n.srv.Addr, args, err)
	}
	return v
}

var errorStat = regexp.MustCompile(`errorstat_(\w+):count=(\d+)`)

// errorReplies counts the error replies a node has sent by prefix (MOVED, ASK, TRYAGAIN…), from INFO errorstats.
func (n node) errorReplies(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range errorStat.FindAllStringSubmatch(n.do(t, "INFO", "errorstats").(string), -1) {
		out[m[1]], _ = strconv.Atoi(m[2])
	}
	return out
}

// masters are the cluster's live masters.
func masters(t *testing.T, c *redistest.RealCluster) []node {
	t.Helper()
	var out []node
	for _, s := range c.Nodes {
		n := dialNode(t, s)
		if role := n.do(t, "ROLE").([]any); role[0] == "master" {
			out = append(out, n)
		}
	}
	return out
}

// An operator moves a tenant's slot to another master while gateways admit its requests: the standard
// resharding (IMPORTING / MIGRATING, MIGRATE of the slot's keys, SETSLOT NODE). Mid-migration the old master
// answers ASK for the keys it no longer holds, and TRYAGAIN for scripts whose keys are split between the two
// (every settlement, whose marker key is new, until the slot's keys have moved); once it is done, MOVED. Under
// the closed fail mode every admission still succeeds (so none was answered by a fail mode), the redirects
// really happened (the nodes' error statistics), every concurrency slot is freed and the counters on the new
// master account for every admitted token: no settlement lost or counted twice on the way. The concurrency
// limit is high because settlements wait out the migration while admissions go on: slots are freed late, not
// lost.
func TestRealClusterSlotMigrationUnderLoad(t *testing.T) {
	c := redistest.StartRealCluster(t, 3)
	snap, tenants, m := clusterPolicy(t, 1, "tokensPerMinute: 1000000000, maxConcurrent: 1000",
		"failMode: closed, leaseFraction: 0, redisTimeout: 2s")
	tn := tenants[0]
	fixed := time.Date(2026, 12, 1, 10, 0, 5, 0, time.UTC) // one window throughout
	l := clusterLimiter(t, c, func() time.Time { return fixed })

	var admitted, failed, refused atomic.Int64
	var firstErr atomic.Value
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				tk, rej, err := l.Admit(context.Background(), req(snap, tn, m, 100))
				switch {
				case err != nil:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				case rej != nil:
					refused.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("refused: %+v", *rej))
				default:
					admitted.Add(1)
					l.Settle(tk, 60, 60) // each settlement refunds 40 of the 100 tokens reserved
				}
			}
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()
	progress := func(what string, more int64) {
		t.Helper()
		from := admitted.Load()
		wait.Within(t, what, 30*time.Second, func() bool {
			if n := failed.Load() + refused.Load(); n > 0 {
				t.Fatalf("%s: %d admitted, then %d failed and %d refused; the first: %v", what, admitted.Load(), failed.Load(), refused.Load(), firstErr.Load())
			}
			return admitted.Load() >= from+more
		})
	}
	progress("load on the cluster", 200)

	key := concKey(tn)
	ms := masters(t, c)
	var src, dst node
	for _, n := range ms {
		if n.srv == c.MasterOf(key) {
			src = n
		}
	}
	for _, n := range ms {
		if n.id != src.id {
			dst = n
			break
		}
	}
	slot := src.do(t, "CLUSTER", "KEYSLOT", key).(int64)
	before := src.errorReplies(t)

	dst.do(t, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.id)
	src.do(t, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id)
	host, port, _ := net.SplitHostPort(dst.srv.Addr)
	for {
		keys := src.do(t, "CLUSTER", "GETKEYSINSLOT", slot, 100).([]any)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		src.do(t, append(args, keys...)...)
	}
	progress("admissions while the slot is migrating", 200)
	mid := src.errorReplies(t)

	for _, n := range []node{dst, src} {
		n.do(t, "CLUSTER", "SETSLOT", slot, "NODE", dst.id)
	}
	for _, n := range ms {
		if n.id != src.id && n.id != dst.id {
			n.do(t, "CLUSTER", "SETSLOT", slot, "NODE", dst.id)
		}
	}
	progress("admissions after the slot moved", 200)
	stop.Store(true)
	wg.Wait()
	stopped := time.Now()
	after := src.errorReplies(t)

	if failed.Load() != 0 || refused.Load() != 0 {
		t.Errorf("%d admissions failed and %d were refused during the resharding; want none", failed.Load(), refused.Load())
	}
	if mid["ASK"] <= before["ASK"] {
		t.Errorf("the migrating master sent no ASK (%d before, %d after): the test did not exercise a migration", before["ASK"], mid["ASK"])
	}
	if after["MOVED"] <= mid["MOVED"] {
		t.Errorf("the old master sent no MOVED after the slot moved (%d, %d)", mid["MOVED"], after["MOVED"])
	}
	if n := src.do(t, "CLUSTER", "COUNTKEYSINSLOT", slot).(int64); n != 0 {
		t.Errorf("the old master still holds %d keys of the slot", n)
	}
	tpm := "ig:" + tag(tn.Name) + ":tenant:tpm:" + windowID(fixed, time.Minute)
	want := strconv.FormatInt(60*admitted.Load(), 10)
	applied := func() (string, int64) {
		used, _ := dst.c.Get(context.Background(), tpm).Result()
		held, _ := dst.c.ZCard(context.Background(), key).Result()
		return used, held
	}
	// Within half the slots' lifetime from the last admission, which renewed it: a slot found free was freed by
	// its settlement, not expired with the key.
	if !wait.Until(time.Until(stopped.Add(ConcurrencyTTL/2)), func() bool { used, held := applied(); return used == want && held == 0 }) {
		used, held := applied()
		t.Errorf("the new master counts %s tokens and %d concurrency slots held for %d admissions settled at 60: want %s and 0",
			used, held, admitted.Load(), want)
	}
	t.Logf("admitted %d; old master's redirects: ASK %d, MOVED %d, TRYAGAIN %d", admitted.Load(),
		after["ASK"]-before["ASK"], after["MOVED"]-before["MOVED"], after["TRYAGAIN"]-before["TRYAGAIN"])
}
