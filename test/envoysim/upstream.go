package envoysim

// This file emulates what Envoy does between picking a cluster and sending an attempt upstream: aggregate
// clusters (health-driven fail-over across their children), EDS health status and outlier ejection, and the
// upstream HTTP filters a cluster runs once per attempt (here the ext_proc filter; the credential injector is
// not emulated).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	aggregatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/aggregate/v3"
	credinjectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/credential_injector/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	genericv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/injected_credentials/generic/v3"
	previousprioritiesv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/priority/previous_priorities/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// overprovisioning is Envoy's default overprovisioning factor (1.4): a priority keeps all the traffic while
// 1/1.4 ≈ 71.4 % of its hosts are available.
const overprovisioning = 1.4

// parseUpstream reads the parts of a cluster this file emulates.
func parseUpstream(cl *Cluster, c *clusterv3.Cluster) error {
	if ct := c.GetClusterType(); ct != nil {
		if ct.GetName() != "envoy.clusters.aggregate" {
			return fmt.Errorf("cluster %s: cluster type %s is not emulated", c.GetName(), ct.GetName())
		}
		agg := &aggregatev3.ClusterConfig{}
		if err := ct.GetTypedConfig().UnmarshalTo(agg); err != nil {
			return fmt.Errorf("cluster %s aggregate config: %w", c.GetName(), err)
		}
		cl.Children = agg.GetClusters()
	}
	for _, lle := range c.GetLoadAssignment().GetEndpoints() {
		for _, lbe := range lle.GetLbEndpoints() {
			switch lbe.GetHealthStatus() {
			case corev3.HealthStatus_UNKNOWN, corev3.HealthStatus_HEALTHY, corev3.HealthStatus_DEGRADED:
			default:
				if cl.Unhealthy == nil {
					cl.Unhealthy = map[string]bool{}
				}
				sa := lbe.GetEndpoint().GetAddress().GetSocketAddress()
				cl.Unhealthy[joinHostPort(sa.GetAddress(), sa.GetPortValue())] = true
			}
		}
	}
	cl.Outlier = c.GetOutlierDetection()
	uneject := cl.Outlier.GetSuccessfulActiveHealthCheckUnejectHost()
	cl.HealthCheck = parseHealthCheck(c.GetHealthChecks(), uneject == nil || uneject.GetValue())
	raw, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if !ok {
		return nil
	}
	opts := &upstreamhttpv3.HttpProtocolOptions{}
	if err := raw.UnmarshalTo(opts); err != nil {
		return fmt.Errorf("cluster %s upstream protocol options: %w", c.GetName(), err)
	}
	for _, hf := range opts.GetHttpFilters() {
		ep, ci := &extprocfilterv3.ExternalProcessor{}, &credinjectorv3.CredentialInjector{}
		switch tc := hf.GetTypedConfig(); {
		case tc.MessageIs(ep):
			if err := tc.UnmarshalTo(ep); err != nil {
				return fmt.Errorf("cluster %s upstream ext_proc: %w", c.GetName(), err)
			}
			cl.UpstreamFilters = append(cl.UpstreamFilters, UpstreamFilter{ExtProc: ep})
		case tc.MessageIs(ci):
			if err := tc.UnmarshalTo(ci); err != nil {
				return fmt.Errorf("cluster %s credential injector: %w", c.GetName(), err)
			}
			generic := &genericv3.Generic{}
			if err := ci.GetCredential().GetTypedConfig().UnmarshalTo(generic); err != nil {
				return fmt.Errorf("cluster %s credential injector: only the generic credential is emulated: %w", c.GetName(), err)
			}
			header := generic.GetHeader()
			if header == "" {
				header = "authorization"
			}
			cl.UpstreamFilters = append(cl.UpstreamFilters, UpstreamFilter{Credential: &Credential{
				Secret: generic.GetCredential().GetName(), Header: strings.ToLower(header), Overwrite: ci.GetOverwrite(),
				AllowWithout: ci.GetAllowRequestWithoutCredential()}})
		}
	}
	return nil
}

// UpstreamFilter is one of a cluster's upstream HTTP filters that the data plane runs: an ext_proc filter or
// a credential injector.
type UpstreamFilter struct {
	ExtProc    *extprocfilterv3.ExternalProcessor
	Credential *Credential
}

// Credential is a credential injector reading an SDS generic secret.
type Credential struct {
	Secret, Header          string
	Overwrite, AllowWithout bool
}

// secretNames lists the SDS secrets the clusters' credential injectors read.
func secretNames(clusters map[string]*Cluster) []string {
	var out []string
	for _, c := range clusters {
		for _, f := range c.UpstreamFilters {
			if f.Credential != nil && !slices.Contains(out, f.Credential.Secret) {
				out = append(out, f.Credential.Secret)
			}
		}
	}
	slices.Sort(out)
	return out
}

// outliers tracks consecutive 5xx (connect failures count as 5xx, Envoy's default without
// split_external_local_origin_errors) and ejections per cluster and host.
type outliers struct {
	mu          sync.Mutex
	consecutive map[string]int
	ejectedTill map[string]time.Time
	ejections   map[string]int
}

func hostKey(cluster, host string) string { return cluster + "|" + host }

// ejected reports whether a host is out of its cluster's rotation.
func (o *outliers) ejected(cluster, host string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return time.Now().Before(o.ejectedTill[hostKey(cluster, host)])
}

// result records an attempt's outcome and ejects the host at the cluster's consecutive_5xx threshold, within
// max_ejection_percent of the cluster (Envoy's defaults: 5, 30 s × ejections, 10 %).
func (o *outliers) result(c *Cluster, host string, failed bool) {
	if c.Outlier == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	k := hostKey(c.Name, host)
	if !failed {
		o.consecutive[k] = 0
		return
	}
	o.consecutive[k]++
	threshold, maxPercent, base := 5, 10, 30*time.Second
	if v := c.Outlier.GetConsecutive_5Xx(); v != nil {
		threshold = int(v.GetValue())
	}
	if v := c.Outlier.GetMaxEjectionPercent(); v != nil {
		maxPercent = int(v.GetValue())
	}
	if d := c.Outlier.GetBaseEjectionTime(); d != nil {
		base = d.AsDuration()
	}
	if o.consecutive[k] < threshold || time.Now().Before(o.ejectedTill[k]) {
		return
	}
	ejected := 0
	for _, ep := range c.Endpoints {
		if time.Now().Before(o.ejectedTill[hostKey(c.Name, ep)]) {
			ejected++
		}
	}
	if 100*(ejected+1) > maxPercent*len(c.Endpoints) {
		return
	}
	o.ejections[k]++
	o.ejectedTill[k] = time.Now().Add(base * time.Duration(o.ejections[k]))
	o.consecutive[k] = 0
}

// available reports whether a host can take traffic: healthy in EDS, passing its active health check, and
// not ejected.
func (dp *DataPlane) available(c *Cluster, host string) bool {
	return !c.Unhealthy[host] && !dp.health.failed(c.Name, host) && !dp.outliers.ejected(c.Name, host)
}

// uneject returns an ejected host to the rotation (a successful active health check).
func (o *outliers) uneject(cluster, host string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.ejectedTill, hostKey(cluster, host))
}

// availableShare is the fraction of a cluster's hosts that are available.
func (dp *DataPlane) availableShare(c *Cluster) float64 {
	if len(c.Endpoints) == 0 {
		return 0
	}
	n := 0
	for _, ep := range c.Endpoints {
		if dp.available(c, ep) {
			n++
		}
	}
	return float64(n) / float64(len(c.Endpoints))
}

// attemptCluster resolves the cluster an attempt goes to: for an aggregate, one of its children, chosen as
// Envoy's aggregate load balancer does — the children's priorities in order, each taking min(100 %, 1.4 ×
// its available share) of what the ones before it left, normalised when together they cannot take it all,
// and the first child when no host is available anywhere (panic). With a retry priority (nil: none), the
// children it excludes take no load.
func (dp *DataPlane) attemptCluster(c *Cluster, rp *retryPriority) *Cluster {
	if len(c.Children) == 0 {
		return c
	}
	var children []*Cluster
	for _, name := range c.Children {
		if ch, ok := dp.cfg.Clusters[name]; ok && len(ch.Children) == 0 {
			children = append(children, ch)
		}
	}
	if len(children) == 0 {
		return nil
	}
	loads, shares := make([]float64, len(children)), make([]float64, len(children))
	spill := func(skip map[*Cluster]bool) float64 {
		for i, ch := range children {
			shares[i] = 0
			if !skip[ch] {
				shares[i] = dp.availableShare(ch)
			}
		}
		return priorityLoads(shares, loads)
	}
	total := spill(rp.exclusions())
	if total == 0 && rp.exclusions() != nil {
		rp.reset() // no child left with an available host: start over
		total = spill(nil)
	}
	if total == 0 {
		return children[0]
	}
	return children[drawPriority(loads, total)]
}

// priorityLoads fills loads with each priority's share of the traffic, Envoy's priority load: in order, each
// takes min(what the ones before it left, 1.4 × its available share of hosts). It returns their sum, below 1
// when together they cannot take it all (the draw is then normalised) and 0 when no host is available.
func priorityLoads(available, loads []float64) float64 {
	left, total := 1.0, 0.0
	for i, a := range available {
		loads[i] = min(left, overprovisioning*a)
		left -= loads[i]
		total += loads[i]
	}
	return total
}

// drawPriority draws a priority by its load (loads sum to total > 0).
func drawPriority(loads []float64, total float64) int {
	r := rand.Float64() * total
	for i, l := range loads {
		if r < l {
			return i
		}
		r -= l
	}
	return len(loads) - 1
}

// retryPriority is a request's envoy.retry_priorities.previous_priorities, as Envoy documents it: every update
// frequency attempts, the priorities (an aggregate's children) attempted so far are excluded from the load,
// which stays as computed between updates; when no priority left has an available host, the attempted ones
// are forgotten and the load starts over.
type retryPriority struct {
	every     int
	attempted []*Cluster
	excluded  map[*Cluster]bool
}

// newRetryPriority reads a route retry policy's retry priority; nil without previous_priorities.
func newRetryPriority(rp *routev3.RetryPolicy) *retryPriority {
	p := rp.GetRetryPriority()
	if p.GetName() != "envoy.retry_priorities.previous_priorities" {
		return nil
	}
	cfg := &previousprioritiesv3.PreviousPrioritiesConfig{}
	if err := p.GetTypedConfig().UnmarshalTo(cfg); err != nil || cfg.GetUpdateFrequency() <= 0 {
		return nil
	}
	return &retryPriority{every: int(cfg.GetUpdateFrequency())}
}

// exclusions are the children the next attempt may not go to (nil for none).
func (p *retryPriority) exclusions() map[*Cluster]bool {
	if p == nil {
		return nil
	}
	if n := len(p.attempted); n > 0 && n%p.every == 0 {
		p.excluded = map[*Cluster]bool{}
		for _, c := range p.attempted {
			p.excluded[c] = true
		}
	}
	return p.excluded
}

// reset forgets the attempted priorities.
func (p *retryPriority) reset() { p.attempted, p.excluded = nil, nil }

// tried records an attempt's cluster.
func (p *retryPriority) tried(c *Cluster) {
	if p != nil {
		p.attempted = append(p.attempted, c)
	}
}

// errNoCredential is a credential injector without its secret (Envoy answers 401).
var errNoCredential = errors.New("credential injector: secret not available")

// runUpstreamFilters runs a cluster's upstream filters, in order, on one attempt's copy of the request. An
// ext_proc filter works in the modes it configures (request headers sent, body BUFFERED; other modes are not
// emulated) and, when it cannot be reached, leaves the request as it was with failure_mode_allow or fails the
// attempt without.
func (dp *DataPlane) runUpstreamFilters(ctx context.Context, c *Cluster, h *headerMap, body []byte) ([]byte, error) {
	for _, f := range c.UpstreamFilters {
		if cred := f.Credential; cred != nil {
			// The credential injector: the secret's value in the header, replacing the client's only when
			// overwrite is set; without the secret the request fails unless allowed to go without.
			v, ok := dp.cfg.Secrets[cred.Secret]
			switch {
			case !ok && !cred.AllowWithout:
				return nil, errNoCredential
			case !ok:
			case cred.Overwrite || h.value(cred.Header) == "":
				h.set(cred.Header, v)
			}
			continue
		}
		cfg := f.ExtProc
		out, err := dp.upstreamExtProc(ctx, cfg, h, body)
		if err != nil {
			if cfg.GetFailureModeAllow() {
				dp.log.Debug("upstream ext_proc failed; continuing (failure_mode_allow)", "cluster", c.Name, "err", err)
				continue
			}
			return nil, err
		}
		body = out
	}
	return body, nil
}

func (dp *DataPlane) upstreamExtProc(ctx context.Context, cfg *extprocfilterv3.ExternalProcessor, h *headerMap, body []byte) ([]byte, error) {
	if dp.procs == nil {
		return nil, fmt.Errorf("no ext_proc connection")
	}
	if name := cfg.GetGrpcService().GetEnvoyGrpc().GetClusterName(); name != "" && dp.cfg.ExtProc != nil &&
		name != dp.cfg.ExtProc.GetGrpcService().GetEnvoyGrpc().GetClusterName() {
		return nil, fmt.Errorf("upstream ext_proc cluster %s is not the processor's", name)
	}
	timeout := 200 * time.Millisecond
	if d := cfg.GetMessageTimeout(); d != nil {
		timeout = d.AsDuration()
	}
	var md []string
	for _, hv := range cfg.GetGrpcService().GetInitialMetadata() {
		md = append(md, hv.GetKey(), hv.GetValue())
	}
	client, ctx := dp.processorClient(ctx, md)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Process(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = stream.CloseSend() }()
	mode := cfg.GetProcessingMode()
	exchange := func(req *extprocv3.ProcessingRequest) (*extprocv3.CommonResponse, error) {
		if err := stream.Send(req); err != nil {
			return nil, err
		}
		type recvd struct {
			r   *extprocv3.ProcessingResponse
			err error
		}
		ch := make(chan recvd, 1)
		go func() { r, err := stream.Recv(); ch <- recvd{r, err} }()
		select {
		case got := <-ch:
			if got.err != nil {
				return nil, got.err
			}
			switch {
			case req.GetRequestHeaders() != nil && got.r.GetRequestHeaders() != nil:
				return got.r.GetRequestHeaders().GetResponse(), nil
			case req.GetRequestBody() != nil && got.r.GetRequestBody() != nil:
				return got.r.GetRequestBody().GetResponse(), nil
			}
			return nil, fmt.Errorf("spurious upstream ext_proc response %T", got.r.GetResponse())
		case <-time.After(timeout):
			return nil, fmt.Errorf("upstream ext_proc message timeout")
		}
	}
	chk := &checker{}
	sendBody := mode.GetRequestBodyMode() == extprocfilterv3.ProcessingMode_BUFFERED && len(body) > 0
	if mode.GetRequestHeaderMode() != extprocfilterv3.ProcessingMode_SKIP {
		first := headersMsg(true, h, nil, !sendBody)
		first.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: mode.GetRequestBodyMode()}
		cr, err := exchange(first)
		if err != nil {
			return nil, err
		}
		if err := chk.applyMutation(h, cr.GetHeaderMutation(), false, false); err != nil {
			return nil, err
		}
	}
	if sendBody {
		cr, err := exchange(bodyMsg(true, body, true))
		if err != nil {
			return nil, err
		}
		if err := chk.applyMutation(h, cr.GetHeaderMutation(), false, false); err != nil {
			return nil, err
		}
		body = mutatedBody(cr.GetBodyMutation(), body)
	}
	return body, nil
}

// retryOn reads a route's retry policy: how many retries, and which outcomes are retried.
type retryOn struct {
	retries                       int
	connectFailure, reset, all5xx bool
	gatewayError                  bool
	statusCodes                   []uint32
}

func parseRetryPolicy(rp interface {
	GetRetryOn() string
	GetRetriableStatusCodes() []uint32
}, numRetries int) retryOn {
	var r retryOn
	if rp == nil || rp.GetRetryOn() == "" {
		return r
	}
	r.retries = numRetries
	for _, tok := range strings.Split(rp.GetRetryOn(), ",") {
		switch strings.TrimSpace(tok) {
		case "connect-failure":
			r.connectFailure = true
		case "reset":
			r.reset = true
		case "5xx":
			r.all5xx, r.reset, r.connectFailure = true, true, true
		case "gateway-error":
			r.gatewayError, r.connectFailure = true, true
		case "retriable-status-codes":
			r.statusCodes = rp.GetRetriableStatusCodes()
		}
	}
	return r
}

// status reports whether a response status is retried.
func (r retryOn) status(code int) bool {
	switch {
	case r.all5xx && code >= 500:
		return true
	case r.gatewayError && (code == 502 || code == 503 || code == 504):
		return true
	}
	return slices.Contains(r.statusCodes, uint32(code))
}
