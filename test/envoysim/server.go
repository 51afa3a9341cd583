package envoysim

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// DetailsHeader carries Envoy's %RESPONSE_CODE_DETAILS% on local replies, so tests can tell a processor's
// 413 from Envoy's own. Real Envoy only logs it.
const DetailsHeader = "x-envoysim-response-code-details"

// Options adjust a DataPlane for tests.
type Options struct {
	// ExtProcAddr overrides the processor address from the config (tests bind free ports): it is then the
	// processor cluster's one host.
	ExtProcAddr string
	// Upstreams rewrites cluster endpoint addresses (config address -> real address).
	Upstreams map[string]string
	Logger    *slog.Logger
}

// DataPlane is the emulated Envoy: an http.Handler.
type DataPlane struct {
	cfg       *Config
	procs     *processors // nil without an ext_proc filter
	checker   *checker
	forward   *headerForwardRules
	hosts     *hostPicker
	outliers  *outliers
	health    *healthState
	transport *http.Transport
	tlsConns  tlsTransports
	log       *slog.Logger
}

// New connects to the processor (if the config has one) and prepares routing.
func New(cfg *Config, opts Options) (*DataPlane, error) {
	dp := &DataPlane{cfg: cfg, hosts: &hostPicker{active: map[string]int{}}, log: opts.Logger, health: newHealthState(),
		outliers: &outliers{consecutive: map[string]int{}, ejectedTill: map[string]time.Time{}, ejections: map[string]int{}}}
	if dp.log == nil {
		dp.log = slog.New(slog.DiscardHandler)
	}
	if len(opts.Upstreams) > 0 {
		for _, c := range cfg.Clusters {
			for i, ep := range c.Endpoints {
				if real, ok := opts.Upstreams[ep]; ok {
					c.Endpoints[i] = real
				}
			}
		}
	}
	dp.transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		ForceAttemptHTTP2:   false,
	}
	if cfg.ExtProc != nil {
		procs, err := dialProcessors(cfg, opts.ExtProcAddr)
		if err != nil {
			return nil, err
		}
		dp.procs = procs
		chk, err := newChecker(cfg.ExtProc.GetMutationRules())
		if err != nil {
			return nil, err
		}
		dp.checker, dp.forward = chk, buildForwardRules(cfg.ExtProc)
	}
	return dp, nil
}

// Close releases the processor connection and idle upstream connections.
func (dp *DataPlane) Close() {
	if dp.procs != nil {
		dp.procs.close()
	}
	dp.transport.CloseIdleConnections()
	dp.tlsConns.close()
}

// Serve answers HTTP/1.1 on lis until ctx ends.
func (dp *DataPlane) Serve(ctx context.Context, lis net.Listener) error {
	dp.runHealthChecks(ctx)
	srv := &http.Server{Handler: dp, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

var hopByHop = map[string]bool{"connection": true, "keep-alive": true, "transfer-encoding": true, "te": true,
	"upgrade": true, "proxy-connection": true, "trailer": true}

// copyHeaders adds HTTP/1 headers to h in lower case, without hop-by-hop headers.
func copyHeaders(h *headerMap, src http.Header) {
	for k, vs := range src {
		lk := strings.ToLower(k)
		if hopByHop[lk] {
			continue
		}
		for _, v := range vs {
			h.add(lk, v)
		}
	}
}

// trailerReader fills the trailers map from the request once its body is read to the end.
type trailerReader struct {
	r    io.Reader
	src  func() http.Header
	dst  *headerMap
	done bool
}

func (t *trailerReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		return n, &localReply{status: http.StatusRequestTimeout, body: []byte("request timeout"), details: "request_overall_timeout"}
	}
	if errors.Is(err, io.EOF) && !t.done {
		t.done = true
		for k, vs := range t.src() {
			for _, v := range vs {
				t.dst.add(strings.ToLower(k), v)
			}
		}
	}
	return n, err
}

// ServeHTTP handles one request as Envoy's HTTP connection manager would.
func (dp *DataPlane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := &headerMap{}
	h.add(":authority", r.Host)
	h.add(":path", r.URL.RequestURI())
	h.add(":method", r.Method)
	h.add(":scheme", "http")
	copyHeaders(h, r.Header)
	if _, ok := h.get("x-request-id"); !ok {
		h.add("x-request-id", rand.Text()) // the HCM generates one by default
	}
	var body io.Reader
	reqTrailers := &headerMap{}
	if r.ContentLength != 0 {
		body = &trailerReader{r: r.Body, src: func() http.Header { return r.Trailer }, dst: reqTrailers}
	}
	var requestDeadline time.Time
	if t := dp.cfg.RequestTimeout; t > 0 {
		// request_timeout: the whole request must have arrived in time, or Envoy answers 408 itself.
		requestDeadline = time.Now().Add(t)
		_ = http.NewResponseController(w).SetReadDeadline(requestDeadline)
	}
	d := &downstream{w: w}
	// The route is resolved when the request headers arrive; a processor's header changes re-route only
	// if it clears the route cache.
	route := routeFor(dp.cfg.Routes, h)

	var f *filter
	if dp.cfg.ExtProc != nil {
		f = newFilter(r.Context(), dp, r.RemoteAddr)
		defer f.close()
		up, err := f.requestPath(h, body, reqTrailers)
		if err != nil {
			if errors.Is(err, context.Canceled) && !requestDeadline.IsZero() && !time.Now().Before(requestDeadline) {
				// The read deadline also cancels the request's context; it is Envoy's request timer that fired.
				err = &localReply{status: http.StatusRequestTimeout, body: []byte("request timeout"), details: "request_overall_timeout"}
			}
			dp.fail(d, err)
			return
		}
		body = up
		if f.routeCleared {
			route = routeFor(dp.cfg.Routes, h)
		}
	}
	status, respHeaders, respBody, respTrailers, finish := dp.forwardUpstream(r.Context(), route, h, body, f)
	defer finish()
	if status == 0 {
		return // the client went away
	}
	if f != nil {
		if err := f.responsePath(respHeaders, respBody, respTrailers, d); err != nil {
			dp.fail(d, err)
		}
		return
	}
	d.writeHeaders(respHeaders)
	if respBody != nil {
		_ = copyFlush(d, respBody)
	}
}

// fail answers a local reply, or resets the stream when the response has already started.
func (dp *DataPlane) fail(d *downstream, err error) {
	var lr *localReply
	if !errors.As(err, &lr) {
		if errors.Is(err, context.Canceled) {
			return
		}
		lr = &localReply{status: http.StatusInternalServerError, body: []byte(err.Error()), details: "envoysim_internal_error"}
	}
	if d.headersSent {
		panic(http.ErrAbortHandler) // Envoy resets the downstream stream
	}
	for _, e := range lr.headers.kv {
		if e.k[0] != ':' {
			d.w.Header().Add(e.k, e.v)
		}
	}
	if d.w.Header().Get("content-type") == "" {
		d.w.Header().Set("content-type", "text/plain")
	}
	d.w.Header().Set(DetailsHeader, lr.details)
	d.w.WriteHeader(lr.status)
	_, _ = d.w.Write(lr.body)
	d.headersSent = true
}

// localResponse is a router-generated reply (direct_response, no route, no upstream): encoder filters,
// the ext_proc among them, still see it.
func localResponse(status int, body, details string) (int, *headerMap, io.Reader, *headerMap, func()) {
	h := &headerMap{}
	h.add(":status", itoa(status))
	h.add("content-type", "text/plain")
	h.add("content-length", itoa(len(body)))
	h.add(DetailsHeader, details)
	return status, h, strings.NewReader(body), nil, func() {}
}

// forwardUpstream runs the router: pick the cluster, choose hosts (override_host list, then the fallback
// policy), retry on connect failure as the route's retry policy allows, and return the response.
func (dp *DataPlane) forwardUpstream(ctx context.Context, route *routev3.Route, h *headerMap, body io.Reader, f *filter) (int, *headerMap, io.Reader, *headerMap, func()) {
	if route == nil {
		return localResponse(http.StatusNotFound, "", "route_not_found")
	}
	if dr := route.GetDirectResponse(); dr != nil {
		return localResponse(int(dr.GetStatus()), string(dr.GetBody().GetInlineString()), "direct_response")
	}
	ra := route.GetRoute()
	cluster, ok := dp.cfg.Clusters[pickCluster(ra, h)]
	if !ok {
		return localResponse(http.StatusServiceUnavailable, "no healthy upstream", "cluster_not_found")
	}
	numRetries := 1
	if n := ra.GetRetryPolicy().GetNumRetries(); n != nil {
		numRetries = int(n.GetValue())
	}
	retry := parseRetryPolicy(ra.GetRetryPolicy(), numRetries)
	timeout := 15 * time.Second
	if t := ra.GetTimeout(); t != nil && t.AsDuration() > 0 {
		timeout = t.AsDuration()
	}
	var md func(string) *structpb.Struct
	if f != nil {
		md = f.namespace
	} else {
		md = func(string) *structpb.Struct { return nil }
	}
	// Envoy keeps the request body for retries (and for upstream filters that buffer it).
	var payload []byte
	if body != nil {
		b, err := io.ReadAll(body)
		if err != nil {
			return localResponse(http.StatusBadRequest, err.Error(), "downstream_body_error")
		}
		payload = b
	}
	tried := map[string]bool{}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	failure := func() (int, *headerMap, io.Reader, *headerMap, func()) {
		cancel()
		return localResponse(http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers. reset reason: connection failure", "upstream_connection_failure")
	}
	priority := newRetryPriority(ra.GetRetryPolicy())
	for attempt := 0; attempt <= retry.retries; attempt++ {
		target := dp.attemptCluster(cluster, priority)
		if target == nil {
			break
		}
		priority.tried(target)
		dp.health.sawTraffic(target.Name)
		listed := overrideList(target, h, md)
		host := dp.hosts.next(dp, target, listed, tried)
		if host == "" {
			break
		}
		tried[host] = true
		// Upstream filters work on this attempt's copy of the request.
		ah := &headerMap{kv: slices.Clone(h.kv)}
		data, err := dp.runUpstreamFilters(ctx, target, ah, payload)
		if errors.Is(err, errNoCredential) {
			cancel()
			return localResponse(http.StatusUnauthorized, "Failed to inject credential.", "failed_to_inject_credential")
		}
		if err != nil {
			cancel()
			return localResponse(http.StatusInternalServerError, "upstream filter failed", "upstream_ext_proc_error")
		}
		// The route's idle_timeout: no byte from upstream for that long ends the attempt — 408 before the
		// response headers, a reset after.
		actx, acancel := context.WithCancel(ctx)
		idle := newIdleTimer(ra.GetIdleTimeout().AsDuration(), acancel)
		scheme, transport := "http://", dp.transport
		if target.TLS != nil {
			scheme, transport = "https://", dp.tlsConns.get(target)
		}
		req, err := http.NewRequestWithContext(actx, headerValueOr(ah, ":method", "GET"), scheme+host+ah.value(":path"), bytes.NewReader(data))
		if err != nil {
			idle.stop()
			cancel()
			return localResponse(http.StatusBadRequest, err.Error(), "bad_request")
		}
		for _, e := range ah.kv {
			switch {
			case e.k[0] == ':' || hopByHop[e.k] || e.k == "content-length":
			default:
				req.Header.Add(e.k, e.v)
			}
		}
		req.ContentLength = int64(len(data))
		if _, ok := ah.get("content-length"); !ok {
			req.ContentLength = -1 // chunked, as the downstream request came (or as a filter left it)
		}
		if body == nil {
			req.Body, req.ContentLength = http.NoBody, 0
		}
		req.Host = ah.value(":authority")
		dialCtx, dialCancel := context.WithTimeout(ctx, target.ConnectTimeout)
		conn, err := (&net.Dialer{}).DialContext(dialCtx, "tcp", host)
		dialCancel()
		if err != nil {
			idle.stop()
			dp.log.Debug("upstream connect failure", "host", host, "err", err)
			dp.outliers.result(target, host, true)
			if retry.connectFailure {
				continue // the next attempt, on another host
			}
			return failure()
		}
		_ = conn.Close()
		dp.hosts.start(host)
		resp, err := transport.RoundTrip(req)
		if err != nil {
			dp.hosts.done(host)
			if idle.stop() {
				cancel()
				return localResponse(http.StatusRequestTimeout, "stream timeout", "stream_idle_timeout")
			}
			if ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled) {
				cancel()
				return 0, nil, nil, nil, func() {}
			}
			dp.outliers.result(target, host, true)
			if retry.reset && attempt < retry.retries {
				continue
			}
			cancel()
			return localResponse(http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers", "upstream_reset_before_response_started")
		}
		dp.outliers.result(target, host, resp.StatusCode >= 500)
		if retry.status(resp.StatusCode) && attempt < retry.retries {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			idle.stop()
			dp.hosts.done(host)
			continue
		}
		if f != nil && target.OverrideHost.GetSelectedHostKey() != nil {
			f.setMetadata(target.OverrideHost.GetSelectedHostKey().GetKey(), target.OverrideHost.GetSelectedHostKey().GetPath()[0].GetKey(), host)
		}
		rh := &headerMap{}
		rh.add(":status", itoa(resp.StatusCode))
		copyHeaders(rh, resp.Header)
		trailers := &headerMap{}
		idle.kick()
		var rb io.Reader = &trailerReader{r: idle.reader(resp.Body), src: func() http.Header { return resp.Trailer }, dst: trailers}
		if resp.ContentLength == 0 {
			rb = nil
		}
		return resp.StatusCode, rh, rb, trailers, func() { idle.stop(); resp.Body.Close(); dp.hosts.done(host); cancel() }
	}
	return failure()
}

func headerValueOr(h *headerMap, k, def string) string {
	if v, ok := h.get(k); ok {
		return v
	}
	return def
}

// idleTimer cancels an upstream attempt that goes idle_timeout without a byte; zero duration never fires.
type idleTimer struct {
	d     time.Duration
	t     *time.Timer
	fired atomic.Bool
}

func newIdleTimer(d time.Duration, cancel context.CancelFunc) *idleTimer {
	it := &idleTimer{d: d}
	if d > 0 {
		it.t = time.AfterFunc(d, func() { it.fired.Store(true); cancel() })
	}
	return it
}

// kick restarts the countdown: a byte arrived.
func (it *idleTimer) kick() {
	if it.t != nil {
		it.t.Reset(it.d)
	}
}

// stop ends the countdown and reports whether it had fired.
func (it *idleTimer) stop() bool {
	if it.t != nil {
		it.t.Stop()
	}
	return it.fired.Load()
}

// reader kicks the timer on every read that returns data.
func (it *idleTimer) reader(r io.Reader) io.Reader {
	if it.t == nil {
		return r
	}
	return idleReader{r, it}
}

type idleReader struct {
	r  io.Reader
	it *idleTimer
}

func (ir idleReader) Read(p []byte) (int, error) {
	n, err := ir.r.Read(p)
	if n > 0 {
		ir.it.kick()
	}
	if err != nil && ir.it.fired.Load() {
		err = errIdleTimeout // not the client's cancellation: Envoy resets the downstream stream
	}
	return n, err
}

var errIdleTimeout = errors.New("upstream idle timeout")
