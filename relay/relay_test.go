package relay

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/pubsub"
	"github.com/infergate/infergate/test/redistest"
	"github.com/infergate/infergate/test/wait"
)

// interval is infergate serve's scrape interval. A failover keeps the readings fresh with about two intervals
// to spare (a follower scrapes itself after two silent ones; readings go stale after five): at 50 ms that was
// 100 ms, which a race-instrumented test beside two CPU hogs overran.
const interval = 100 * time.Millisecond

// engine serves a vLLM /metrics exposition and counts the scrapes.
type engine struct {
	srv     *httptest.Server
	scrapes atomic.Int64
}

func startEngine(t *testing.T, exposition []byte) *engine {
	e := &engine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		e.scrapes.Add(1)
		_, _ = w.Write(exposition)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

type gatewayReplica struct {
	scraper *fleet.Scraper
	relay   *Relay
	stop    context.CancelFunc
	done    chan struct{}
}

func startGateway(t *testing.T, redisAddr string, targets []fleet.Target) *gatewayReplica {
	t.Helper()
	return startGatewayWith(t, redis.NewClient(&redis.Options{Addr: redisAddr}), targets)
}

func startGatewayWith(t *testing.T, client redis.UniversalClient, targets []fleet.Target) *gatewayReplica {
	t.Helper()
	return startGatewayIn(t, client, targets, "")
}

func startGatewayIn(t *testing.T, client redis.UniversalClient, targets []fleet.Target, region string) *gatewayReplica {
	t.Helper()
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	g := &gatewayReplica{scraper: &fleet.Scraper{Interval: interval}, stop: cancel, done: make(chan struct{})}
	g.relay = New(Options{Client: client, Scraper: g.scraper, Interval: interval, Region: region})
	g.scraper.Relay = g.relay
	g.scraper.SetTargets(targets)
	var wg sync.WaitGroup
	wg.Go(func() { g.relay.Run(ctx) })
	wg.Go(func() { g.scraper.Run(ctx) })
	go func() { wg.Wait(); close(g.done) }()
	t.Cleanup(func() { cancel(); <-g.done })
	<-g.relay.Ready()
	return g
}

func leaders(gs []*gatewayReplica) (n int, who *gatewayReplica) {
	for _, g := range gs {
		if g.relay.Leader() {
			n, who = n+1, g
		}
	}
	return n, who
}

// Three gateway replicas on a real redis-server: one holds the lease and scrapes, the others take its
// readings, so each engine is scraped about once per interval instead of three times; when the scraping
// replica stops, another takes over and every replica's readings stay fresh throughout.
func TestOneReplicaScrapesForAll(t *testing.T) {
	exposition, err := os.ReadFile("../fleet/testdata/vllm-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t)
	engines := []*engine{startEngine(t, exposition), startEngine(t, exposition)}
	var targets []fleet.Target
	for _, e := range engines {
		targets = append(targets, fleet.Target{Addr: e.addr(), Dialect: fleet.MustDialect("vllm")})
	}
	var gs []*gatewayReplica
	for range 3 {
		gs = append(gs, startGateway(t, srv.Addr, targets))
	}
	wait.For(t, "one replica to hold the lease", func() bool { n, _ := leaders(gs); return n == 1 })
	_, leader := leaders(gs)
	wait.For(t, "the leader's first scrape", func() bool { _, fresh := leader.scraper.Metrics(engines[0].addr()); return fresh })
	want, _ := leader.scraper.Metrics(engines[0].addr())
	for _, g := range gs {
		wait.For(t, "every replica to read the engines", func() bool {
			m, fresh := g.scraper.Metrics(engines[0].addr())
			return fresh && m.Running == want.Running && m.KVUtil == want.KVUtil && m.NumBlocks == want.NumBlocks
		})
	}

	// Over the next 40 rounds the leader scrapes, each engine sees about one scrape a round.
	roundsOf := func() float64 {
		return testutil.ToFloat64(leader.relay.o.Metrics.rounds.WithLabelValues("scraped_leader"))
	}
	startRounds, startScrapes := roundsOf(), engines[0].scrapes.Load()
	wait.For(t, "40 leader rounds", func() bool { return roundsOf()-startRounds >= 40 })
	rounds, scrapes := roundsOf()-startRounds, float64(engines[0].scrapes.Load()-startScrapes)
	t.Logf("%v rounds: engine scraped %v times by three replicas", rounds, scrapes)
	if scrapes > 1.5*rounds {
		t.Errorf("%v scrapes of one engine in %v rounds by three replicas: the followers are still scraping", scrapes, rounds)
	}

	// The leader goes: another replica takes the lease, and the readings never go stale meanwhile.
	leader.stop()
	<-leader.done
	var rest []*gatewayReplica
	for _, g := range gs {
		if g != leader {
			rest = append(rest, g)
		}
	}
	wait.For(t, "a new leader, every reading fresh meanwhile", func() bool {
		for _, g := range rest {
			for _, e := range engines {
				if _, fresh := g.scraper.Metrics(e.addr()); !fresh {
					t.Fatalf("a reading of %s went stale during the failover", e.addr())
				}
			}
		}
		n, _ := leaders(rest)
		return n == 1
	})
}

// The replicas of each region share readings among themselves: one leader per region, on one Redis, and a
// region never takes another's readings (an engine far from one region is not down for the other).
func TestEachRegionRelaysItsOwnReadings(t *testing.T) {
	exposition, err := os.ReadFile("../fleet/testdata/vllm-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t)
	e := startEngine(t, exposition)
	targets := []fleet.Target{{Addr: e.addr(), Dialect: fleet.MustDialect("vllm")}}
	east := []*gatewayReplica{
		startGatewayIn(t, redis.NewClient(&redis.Options{Addr: srv.Addr}), targets, "us-east"),
		startGatewayIn(t, redis.NewClient(&redis.Options{Addr: srv.Addr}), targets, "us-east"),
	}
	west := []*gatewayReplica{startGatewayIn(t, redis.NewClient(&redis.Options{Addr: srv.Addr}), targets, "us-west")}
	wait.For(t, "one leader in each region", func() bool {
		ne, _ := leaders(east)
		nw, _ := leaders(west)
		return ne == 1 && nw == 1
	})
	_, leader := leaders(east)
	accepted := func(g *gatewayReplica) float64 {
		return testutil.ToFloat64(g.relay.o.Metrics.received.WithLabelValues("accepted"))
	}
	follower := east[0]
	if follower == leader {
		follower = east[1]
	}
	wait.For(t, "the east follower to take the east leader's rounds", func() bool { return accepted(follower) >= 5 })
	if got := accepted(west[0]); got != 0 {
		t.Fatalf("the west region's replica took %v rounds from the east", got)
	}
	if ChannelFor("us-east") == ChannelFor("us-west") || LeaseKeyFor("") != LeaseKey {
		t.Fatal("regions share a channel, or a gateway without a region has another key")
	}
}

// Without Redis each replica scrapes on its own, as without a relay.
func TestWithoutRedisEveryReplicaScrapes(t *testing.T) {
	exposition, err := os.ReadFile("../fleet/testdata/vllm-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	e := startEngine(t, exposition)
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 10 * time.Millisecond})
	defer func() { _ = client.Close() }()
	s := &fleet.Scraper{Interval: interval}
	r := New(Options{Client: client, Scraper: s, Interval: interval})
	s.Relay = r
	s.SetTargets([]fleet.Target{{Addr: e.addr(), Dialect: fleet.MustDialect("vllm")}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(ctx) })
	wg.Go(func() { s.Run(ctx) })
	defer wg.Wait()
	defer cancel()
	wait.For(t, "the replica to scrape by itself", func() bool {
		_, fresh := s.Metrics(e.addr())
		return fresh && e.scrapes.Load() >= 3
	})
	if r.Leader() {
		t.Error("a replica without Redis holds the lease")
	}
}

// On a real Redis Cluster the lease is one key on one master and the rounds reach every replica.
func TestRelayOnARealCluster(t *testing.T) {
	exposition, err := os.ReadFile("../fleet/testdata/vllm-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	cluster := redistest.StartRealCluster(t, 3)
	e := startEngine(t, exposition)
	targets := []fleet.Target{{Addr: e.addr(), Dialect: fleet.MustDialect("vllm")}}
	var gs []*gatewayReplica
	for i := range 2 {
		addrs := cluster.Addrs()
		client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addrs[i%len(addrs)]}})
		gs = append(gs, startGatewayWith(t, client, targets))
	}
	wait.For(t, "one replica to hold the lease", func() bool { n, _ := leaders(gs); return n == 1 })
	_, leader := leaders(gs)
	for _, g := range gs {
		if g == leader {
			continue
		}
		wait.For(t, "the other replica to take the relayed rounds", func() bool {
			return testutil.ToFloat64(g.relay.o.Metrics.received.WithLabelValues("accepted")) >= 5
		})
	}
}

// With a message key a round is believed only when a replica sealed it: an unsigned or foreign-keyed round
// (any Redis client can publish one) is dropped and counted, and the scraper keeps its own readings.
func TestForgedRoundsAreDropped(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	sealer, err := pubsub.NewSealer([]byte("the replicas' shared message key, 32+ bytes"), clock)
	if err != nil {
		t.Fatal(err)
	}
	s := &fleet.Scraper{Interval: interval}
	vllm, _ := fleet.DialectFor("vllm")
	s.SetTargets([]fleet.Target{{Addr: "10.0.0.1:8000", Dialect: vllm}})
	r := New(Options{Scraper: s, Interval: interval, Now: clock, Sealer: sealer})
	round, err := encode("another-replica", []fleet.Reading{{Addr: "10.0.0.1:8000", Metrics: fleet.EngineMetrics{Waiting: 999, At: now}}}, now)
	if err != nil {
		t.Fatal(err)
	}
	attacker, _ := pubsub.NewSealer([]byte("an attacker's key, thirty-two bytes long!!"), clock)
	r.receive(round)
	r.receive(attacker.Seal(Channel, round))
	for _, result := range []string{"unsigned", "forged"} {
		if n := testutil.ToFloat64(r.o.Metrics.received.WithLabelValues(result)); n != 1 {
			t.Errorf("%s rounds counted %v, want 1", result, n)
		}
	}
	if n := testutil.ToFloat64(r.o.Metrics.received.WithLabelValues("accepted")); n != 0 {
		t.Fatalf("%v forged rounds accepted", n)
	}
	r.receive(sealer.Seal(Channel, round))
	if n := testutil.ToFloat64(r.o.Metrics.received.WithLabelValues("accepted")); n != 1 {
		t.Errorf("a sealed round: accepted %v, want 1", n)
	}
}
