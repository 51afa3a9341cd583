// Package extproc is the per-request stage of infergate: an Envoy ext_proc server that reads each OpenAI-style
// request, identifies the tenant, picks model, pool and replica, and answers Envoy with routing headers and
// envoy.lb metadata or with an OpenAI-shaped error; on the way back it settles token usage.
package extproc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/infergate/infergate/admission"
	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/quota"
	"github.com/infergate/infergate/telemetry"
)

// Settlement is the final account of one routed request (see director.Settlement).
type Settlement = director.Settlement

// Metrics are the request path's Prometheus series (see director.Metrics).
type Metrics = director.Metrics

// NewMetrics creates the request path's series and registers them on reg (nil: unregistered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics { return director.NewMetrics(reg) }

// Options wires a Server to the other stages.
type Options struct {
	Policies *policies.Store
	Picker   picker.Picker // default: prefix affinity with bounded load over InFlight
	InFlight *fleet.InFlight
	// Engines, when set, feeds engine metrics (saturation, queues) to the default picker.
	Engines picker.EngineView
	Metrics *Metrics
	Logger  *slog.Logger
	// Quotas, when set, admits each request against its tenant's limits and settles the real usage.
	Quotas *quota.Limiter
	// OnSettle, when set, receives the Settlement of every routed request (tests); it must not block for long.
	OnSettle func(Settlement)
	// Observers hear of every request that reached routing (metrics, audit): see director.Options.Observers.
	Observers []director.SettleObserver
	// Queue, when set, holds the requests no endpoint has room for, for policies with spec.admission.
	Queue *admission.Queue
	// Tracing, when set, gives every authenticated request a span and passes its context to the engine.
	Tracing *telemetry.Tracing
	// Digests makes settlements carry sha256 digests of the prompt and of the generated text (for the audit
	// log); they cost a parse of the body after the response.
	Digests bool
	// Rollouts, when set, gives rolled-out models' candidate shares (rollout.Controller).
	Rollouts director.Rollouts
	// Now replaces the clock of request timing and of the failed-authentication limit (tests).
	Now func() time.Time
}

// Server implements envoy.service.ext_proc.v3.ExternalProcessor.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	opts     Options
	auth     *authGuard
	director *director.Director
}

// New builds a Server and the director behind it; Policies is required, everything else has a default.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	do := director.Options{Policies: opts.Policies, Picker: opts.Picker, InFlight: opts.InFlight, Engines: opts.Engines,
		Metrics: opts.Metrics, Logger: opts.Logger, Now: opts.Now, Observers: opts.Observers, Queue: opts.Queue, Rollouts: opts.Rollouts}
	if opts.Quotas != nil { // a nil *quota.Limiter must not become a non-nil Admission
		do.Admission = opts.Quotas
	}
	if f := opts.OnSettle; f != nil {
		do.Observers = append(do.Observers[:len(do.Observers):len(do.Observers)], director.ObserverFunc(func(st Settlement) {
			if st.Routed {
				f(st)
			}
		}))
	}
	return &Server{opts: opts, auth: newAuthGuard(opts.Now), director: director.New(do)}
}

// HealthServices are the gRPC health service names the Gateway API Inference Extension protocol requires.
var HealthServices = []string{"", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"}

// Register adds the processor and a health server reporting SERVING on every HealthServices name to g. The
// returned health server lets the caller report NOT_SERVING while draining.
func (s *Server) Register(g *grpc.Server) *health.Server {
	extprocv3.RegisterExternalProcessorServer(g, s)
	hs := health.NewServer()
	for _, name := range HealthServices {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(g, hs)
	return hs
}

// MaxMessageBytes is the gRPC receive limit the server needs: a BUFFERED body arrives in one message, and the
// largest body a policy may allow is 64 MiB, plus room for headers.
const MaxMessageBytes = 64<<20 + 1<<20

// ServerOptions are the gRPC options the ext_proc listener should use.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		// A BUFFERED body arrives as one message; grpc-go's 4 MiB default would fail large prompts.
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		// Envoy multiplexes one stream per HTTP request on few connections; do not cap streams at 100.
		grpc.MaxConcurrentStreams(1 << 20),
		// Let Envoy send a whole prompt without waiting for window updates: with grpc-go's 64 KiB starting
		// window a 256 KiB body costs several round trips before BDP probing catches up.
		grpc.InitialWindowSize(4 << 20),
		grpc.InitialConnWindowSize(64 << 20),
		// Body-sized messages: see BufferPool.
		experimental.BufferPool(sharedBufferPool),
	}
}

var sharedBufferPool = &BufferPool{}

// endOfStream turns a Recv error into the stream handler's result: nil when Envoy closed or cancelled the
// stream, which is how every stream ends.
func endOfStream(err error) error {
	if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Process handles one HTTP request's ext_proc stream, from request headers to the end of the response.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	if model, fallback := fallbackLeg(stream.Context()); model != "" || fallback != "" {
		return s.processFallbackLeg(stream, model, fallback)
	}
	m := s.opts.Metrics
	m.ActiveStreams.Inc()
	defer m.ActiveStreams.Dec()
	rs := &requestState{srv: s, ctx: stream.Context()}
	defer rs.close()
	for {
		msg, err := stream.Recv()
		if err != nil {
			return endOfStream(err)
		}
		out := rs.handle(msg)
		for _, resp := range out {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
		if rs.finished {
			// An immediate response ends processing; closing the stream with OK tells Envoy we are done.
			return nil
		}
	}
}
