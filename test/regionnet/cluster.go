package regionnet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	toxiclient "github.com/Shopify/toxiproxy/v2/client"

	"github.com/infergate/infergate/policies"
)

// Ports every region uses for its services, on every address of its namespace.
const (
	enginePort0 = 8000 // engine k of region i listens on enginePort0 + 10i + k: unique across regions, so that a
	// region's engines, on every address, do not take the ports its proxies to the others listen on
	EdgePort      = 8080 // the data plane
	fleetAdmin    = 8099 // the engines' fault injection
	MetricsPort   = 9090 // infergate's /metrics
	toxiproxyPort = 8474
	redisPort     = 6379
	insidePort    = 8443 // a managed API kept inside a region
)

// enginePort is engine k's port in region i.
func enginePort(i, k int) int { return enginePort0 + 10*i + k }

// Options describe the fleet a Cluster runs.
type Options struct {
	// Bins are the programs: infergate, infergate-sim and edge (test/regionnet/edge).
	Infergate, Sim, Edge string
	// Root is the repository (the data plane's bootstrap); Dir holds policies, fleets and logs.
	Root, Dir string
	// Regions are the regions, the first holding Redis; RTT is the real delay between two regions, by
	// "a/b" (either order), which the policy also states.
	Regions []string
	RTT     map[string]time.Duration
	// Engines per region (default 2); Placement is routing.placement (default slo); Failback is
	// routing.regionFailback (default 3s).
	Engines   int
	Placement string
	Failback  time.Duration
	// Inside, when set, is a region whose managed API keeps data there (a fallback with that region).
	Inside string
	// TimeScale runs the simulated engines faster than the hardware (default 0.05).
	TimeScale float64
	// MeteredRPS, when set, adds the tenant "metered" with that requestsPerSecond limit, which Run sends to
	// every region at several times the limit to measure how the limit holds across regions.
	MeteredRPS int
}

// Cluster is the running fleet: per region a namespace with infergate, its engines and its edge (the data
// plane and the proxies to the other regions), Redis in the first region, and a managed API outside every
// region in the caller's namespace.
type Cluster struct {
	*Net
	opts    Options
	Managed *Proc // the managed API outside every region
	managed string
	procs   map[string]map[string]*Proc // region → name → process
}

// Key is the bearer key of tenant ("open", or "pinned-<region>").
func Key(tenant string) string { return "sk-region-" + tenant }

// EdgeURL is region's data plane.
func (c *Cluster) EdgeURL(region string) string {
	return fmt.Sprintf("http://%s:%d", WanIP(c.Index(region)), EdgePort)
}

// MetricsURL is region's infergate /metrics.
func (c *Cluster) MetricsURL(region string) string {
	return fmt.Sprintf("http://%s:%d/metrics", WanIP(c.Index(region)), MetricsPort)
}

// servedModel is the name every engine serves the model under, in every region: a body rewritten for one pool
// is good for another's, as Envoy's failover between regions needs.
const servedModel = "m-served"

// Start brings the cluster up: namespaces, proxies, Redis, engines, gateways, data planes.
func Start(ctx context.Context, o Options) (_ *Cluster, err error) {
	if o.Engines == 0 {
		o.Engines = 2
	}
	if o.Placement == "" {
		o.Placement = "slo"
	}
	if o.Failback == 0 {
		o.Failback = 3 * time.Second
	}
	if o.TimeScale == 0 {
		o.TimeScale = 0.05
	}
	n, err := New(ctx, o.Regions)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Net: n, opts: o, procs: map[string]map[string]*Proc{}}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err := c.startManaged(ctx); err != nil {
		return nil, err
	}
	policy := filepath.Join(o.Dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(c.policy()), 0o644); err != nil {
		return nil, err
	}
	for _, r := range o.Regions {
		if err := c.startEdgeProxies(ctx, r); err != nil {
			return nil, err
		}
	}
	if err := c.startRedis(ctx); err != nil {
		return nil, err
	}
	for _, r := range o.Regions {
		if err := c.startEngines(ctx, r); err != nil {
			return nil, err
		}
		if err := c.StartGateway(ctx, r); err != nil {
			return nil, err
		}
	}
	for _, r := range o.Regions {
		if err := c.waitEdge(ctx, r); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// proc records a region's process.
func (c *Cluster) proc(region, name string, p *Proc) {
	if c.procs[region] == nil {
		c.procs[region] = map[string]*Proc{}
	}
	c.procs[region][name] = p
}

// Proc is a region's process by name: "infergate", "engines", "edge", "redis".
func (c *Cluster) Proc(region, name string) *Proc { return c.procs[region][name] }

// startManaged runs the managed API outside every region, in the caller's namespace on its wan end.
func (c *Cluster) startManaged(ctx context.Context) error {
	lis, err := net.Listen("tcp", "198.18.0.1:0")
	if err != nil {
		return err
	}
	c.managed = lis.Addr().String()
	lis.Close()
	fleet := filepath.Join(c.opts.Dir, "managed.yaml")
	spec := fmt.Sprintf("timeScale: %v\nreplicas:\n- {name: managed, addr: %q, model: m-managed, hardware: h200, numGPUBlocks: 8192, maxNumSeqs: 256}\n",
		c.opts.TimeScale, c.managed)
	if err := os.WriteFile(fleet, []byte(spec), 0o644); err != nil {
		return err
	}
	p, err := start("managed", commandIn(ctx, "", c.opts.Sim, "--fleet", fleet), filepath.Join(c.opts.Dir, "managed.log"), "", 0)
	if err != nil {
		return err
	}
	c.Managed = p
	return waitDial(ctx, c.managed, 20*time.Second)
}

// StartManaged restarts the managed API outside every region (after a scenario killed it).
func (c *Cluster) StartManaged(ctx context.Context) error { return c.startManaged(ctx) }

// startEdgeProxies starts a region's edge's Toxiproxy server early (the edge waits for its gateway before it
// serves) and makes its proxies: one for each service of every other region, on that region's service name.
func (c *Cluster) startEdgeProxies(ctx context.Context, region string) error {
	i := c.Index(region)
	// The data plane's ext_proc fails over to the other regions' gateways in the region's failover order
	// (deploy/envoy/envoy-regions.yaml), each reached through this region's proxy for it.
	snap, err := policies.Parse("policy.yaml", []byte(c.policy()))
	if err != nil {
		return err
	}
	var failover []string
	for _, other := range snap.RegionOrder(region)[1:] {
		failover = append(failover, fmt.Sprintf("%s:%d", ServiceIP(c.Index(other)), extprocPort(c.Index(other))))
	}
	args := []string{"-listen", fmt.Sprintf("%s:%d", WanIP(i), EdgePort), "-bootstrap", filepath.Join(c.opts.Root, "deploy/envoy/envoy-regions.yaml"),
		"-region", region, "-extproc", fmt.Sprintf("127.0.0.1:%d", extprocPort(i)), "-extproc-failover", strings.Join(failover, ","),
		"-toxiproxy", fmt.Sprintf("%s:%d", WanIP(i), toxiproxyPort), "-wait", "2m"}
	p, err := start("edge "+region, c.Command(ctx, region, c.opts.Edge, args...), filepath.Join(c.opts.Dir, "edge-"+region+".log"), "", 0)
	if err != nil {
		return err
	}
	c.proc(region, "edge", p)
	api := fmt.Sprintf("%s:%d", WanIP(i), toxiproxyPort)
	if err := waitDial(ctx, api, 20*time.Second); err != nil {
		return err
	}
	client := toxiclient.NewClient(api)
	for _, other := range c.Regions {
		if other == region {
			continue
		}
		j := c.Index(other)
		for _, port := range c.servicePorts(other) {
			name := fmt.Sprintf("%s-%d", other, port)
			prx, err := client.CreateProxy(name, fmt.Sprintf("%s:%d", ServiceIP(j), port), fmt.Sprintf("%s:%d", WanIP(j), port))
			if err != nil {
				return fmt.Errorf("proxy %s in %s: %w", name, region, err)
			}
			if half := c.RTT(region, other) / 2; half > 0 {
				for _, stream := range []string{"upstream", "downstream"} {
					if _, err := prx.AddToxic("rtt-"+stream, "latency", stream, 1, toxiclient.Attributes{"latency": half.Milliseconds()}); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// servicePorts are the ports of a region's services that other regions reach.
func (c *Cluster) servicePorts(region string) []int {
	var ports []int
	for k := 1; k <= c.opts.Engines; k++ {
		ports = append(ports, enginePort(c.Index(region), k))
	}
	if region == c.Regions[0] {
		ports = append(ports, redisPort)
	}
	if region == c.opts.Inside {
		ports = append(ports, insidePort)
	}
	return append(ports, extprocPort(c.Index(region)))
}

// extprocPort is region i's infergate ext_proc port, which the other regions' data planes fail over to: unique
// across regions, as the engines' are.
func extprocPort(i int) int { return 9010 + i }

// RTT is the round trip between two regions the proxies add (and the policy states).
func (c *Cluster) RTT(a, b string) time.Duration {
	if d, ok := c.opts.RTT[a+"/"+b]; ok {
		return d
	}
	return c.opts.RTT[b+"/"+a]
}

// Links are region's proxies to other: cut one (Disable) for a partition, add latency for a slow link.
func (c *Cluster) Links(region, other string) ([]*toxiclient.Proxy, error) {
	client := toxiclient.NewClient(fmt.Sprintf("%s:%d", WanIP(c.Index(region)), toxiproxyPort))
	all, err := client.Proxies()
	if err != nil {
		return nil, err
	}
	var out []*toxiclient.Proxy
	for name, p := range all {
		if strings.HasPrefix(name, other+"-") {
			out = append(out, p)
		}
	}
	return out, nil
}

func (c *Cluster) startRedis(ctx context.Context) error {
	r := c.Regions[0]
	p, err := start("redis", c.Command(ctx, r, "redis-server", "--port", fmt.Sprint(redisPort), "--bind", "0.0.0.0", "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--dir", c.opts.Dir, "--loglevel", "warning"), filepath.Join(c.opts.Dir, "redis.log"), "", 0)
	if err != nil {
		return err
	}
	c.proc(r, "redis", p)
	return waitDial(ctx, fmt.Sprintf("%s:%d", WanIP(1), redisPort), 20*time.Second)
}

// startEngines runs a region's simulated engines (and its managed API, when it keeps one).
func (c *Cluster) startEngines(ctx context.Context, region string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "timeScale: %v\nadminAddr: \"0.0.0.0:%d\"\nreplicas:\n", c.opts.TimeScale, fleetAdmin)
	for k := 1; k <= c.opts.Engines; k++ {
		fmt.Fprintf(&b, "- {name: %s-%d, addr: \"0.0.0.0:%d\", model: %s, hardware: l40s, numGPUBlocks: 4096, maxNumSeqs: 64}\n",
			region, k, enginePort(c.Index(region), k), servedModel)
	}
	if region == c.opts.Inside {
		fmt.Fprintf(&b, "- {name: inside, addr: \"0.0.0.0:%d\", model: m-managed-%s, hardware: h200, numGPUBlocks: 8192, maxNumSeqs: 256}\n", insidePort, region)
	}
	fleet := filepath.Join(c.opts.Dir, "fleet-"+region+".yaml")
	if err := os.WriteFile(fleet, []byte(b.String()), 0o644); err != nil {
		return err
	}
	p, err := start("engines "+region, c.Command(ctx, region, c.opts.Sim, "--fleet", fleet), filepath.Join(c.opts.Dir, "engines-"+region+".log"), "", 0)
	if err != nil {
		return err
	}
	c.proc(region, "engines", p)
	return waitDial(ctx, fmt.Sprintf("%s:%d", WanIP(c.Index(region)), enginePort(c.Index(region), 1)), 20*time.Second)
}

// StartGateway (re)starts a region's infergate.
func (c *Cluster) StartGateway(ctx context.Context, region string) error {
	args := []string{"serve", "--policy", filepath.Join(c.opts.Dir, "policy.yaml"), "--region", region,
		"--redis-addr", fmt.Sprintf("%s:%d", ServiceIP(1), redisPort), "--extproc-addr", fmt.Sprintf("0.0.0.0:%d", extprocPort(c.Index(region))), "--xds-addr", "127.0.0.1:18000",
		"--metrics-addr", fmt.Sprintf("%s:%d", WanIP(c.Index(region)), MetricsPort), "--admin-addr", "", "--scrape-interval", "100ms",
		"--instance-id", "gateway-" + region, "--drain-timeout", "2s", "--log-level", "warn"}
	cmd := c.Command(ctx, region, c.opts.Infergate, args...)
	cmd.Env = append(os.Environ(), "REGION_MANAGED_KEY=managed-key")
	p, err := start("infergate "+region, cmd, filepath.Join(c.opts.Dir, "infergate-"+region+".log"), "", 0)
	if err != nil {
		return err
	}
	c.proc(region, "infergate", p)
	return waitDial(ctx, fmt.Sprintf("%s:%d", WanIP(c.Index(region)), MetricsPort), 30*time.Second)
}

// waitEdge waits until a region's data plane serves.
func (c *Cluster) waitEdge(ctx context.Context, region string) error {
	return waitDial(ctx, fmt.Sprintf("%s:%d", WanIP(c.Index(region)), EdgePort), 2*time.Minute)
}

// Faults sets a fault (fleetsim.Faults as JSON, e.g. {"refuse":true}) on every engine of a region.
func (c *Cluster) Faults(ctx context.Context, region, faults string) error {
	for k := 1; k <= c.opts.Engines; k++ {
		if err := put(ctx, fmt.Sprintf("http://%s:%d/faults/%s-%d", WanIP(c.Index(region)), fleetAdmin, region, k), faults); err != nil {
			return err
		}
	}
	return nil
}

// policy is the one policy every region's gateway serves.
func (c *Cluster) policy() string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  gateway: {defaultMaxTokens: 16}
  quotas: {failMode: open, redisTimeout: 500ms, gatewayReplicas: %d}
  routing: {placement: %s, regionFailback: %s}
  slo: {ttft: 2s}
  hardwareClasses:
    l40s: {costPerHour: 1.1, prefillTokensPerSecond: 7000, decodeTokensPerSecond: 1200}
  regions:
`, len(c.Regions), c.opts.Placement, c.opts.Failback)
	for i, r := range c.Regions {
		var rtts []string
		for _, o := range c.Regions[i+1:] {
			rtts = append(rtts, fmt.Sprintf("%s: %s", o, c.RTT(r, o)))
		}
		fmt.Fprintf(&b, "  - {name: %s, rtt: {%s}}\n", r, strings.Join(rtts, ", "))
	}
	b.WriteString("  models:\n  - name: m\n    pools:\n")
	for i, r := range c.Regions {
		var eps []string
		for k := 1; k <= c.opts.Engines; k++ {
			eps = append(eps, fmt.Sprintf("%q", fmt.Sprintf("%s:%d", ServiceIP(i+1), enginePort(i+1, k))))
		}
		fmt.Fprintf(&b, "    - {name: pool-%s, region: %s, hardwareClass: l40s, engine: vllm, servedModel: %s, maxConcurrency: 64, endpoints: [%s]}\n",
			r, r, servedModel, strings.Join(eps, ", "))
	}
	b.WriteString("    fallbacks:\n")
	fmt.Fprintf(&b, "    - {name: outside, baseURL: \"http://%s/v1\", model: m-managed, apiKeyFrom: \"env:REGION_MANAGED_KEY\", when: [saturated, unavailable]}\n", c.managed)
	if c.opts.Inside != "" {
		fmt.Fprintf(&b, "    - {name: inside, baseURL: \"http://%s:%d/v1\", model: m-managed-%s, region: %s, apiKeyFrom: \"env:REGION_MANAGED_KEY\", when: [saturated, unavailable]}\n",
			ServiceIP(c.Index(c.opts.Inside)), insidePort, c.opts.Inside, c.opts.Inside)
	}
	b.WriteString("  tenants:\n")
	fmt.Fprintf(&b, "  - {name: open, apiKeys: [%q], models: [\"*\"]}\n", keyHash(Key("open")))
	if c.opts.MeteredRPS > 0 {
		fmt.Fprintf(&b, "  - {name: metered, apiKeys: [%q], models: [\"*\"], quota: {requestsPerSecond: %d}}\n", keyHash(Key("metered")), c.opts.MeteredRPS)
	}
	for _, r := range c.Regions {
		fmt.Fprintf(&b, "  - {name: pinned-%s, residency: [%s], apiKeys: [%q], models: [\"*\"]}\n", r, r, keyHash(Key("pinned-"+r)))
	}
	return b.String()
}

func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Close stops every process and removes the namespaces.
func (c *Cluster) Close() {
	for _, byName := range c.procs {
		for _, p := range byName {
			p.Kill()
		}
	}
	if c.Managed != nil {
		c.Managed.Kill()
	}
	c.Net.Close()
}

// commandIn is name run in a region's namespace, or the caller's for "".
func commandIn(ctx context.Context, ns, name string, args ...string) *exec.Cmd {
	if ns == "" {
		return exec.CommandContext(ctx, name, args...)
	}
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

// put sends a PUT with a JSON body and wants a 2xx.
func put(ctx context.Context, url, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("PUT %s: %s", url, resp.Status)
	}
	return nil
}
