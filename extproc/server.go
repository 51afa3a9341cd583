// Package extproc is the per-request stage of infergate: an Envoy ext_proc server that reads each OpenAI-style
// request, identifies the tenant, picks model, pool and replica, and answers Envoy with routing headers and
// envoy.lb metadata or with an OpenAI-shaped error; on the way back it settles token usage.
package extproc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/infergate/infergate/audit"
	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/netturn"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/telemetry"
)

// Options wires a Server to the stage behind it.
type Options struct {
	Policies *policies.Store
	// Director decides each request between the protocol and the stages (routing, quotas, admission, settling);
	// nil: a director with its defaults over Policies (tests and benchmarks). infergate serve builds it in
	// gateway, over the same store.
	Director *director.Director
	Logger   *slog.Logger
	// Tracing, when set, gives every authenticated request a span and passes its context to the engine.
	Tracing *telemetry.Tracing
	// DigestKey, when set, makes settlements carry digests of the prompt and of the generated text under it (for
	// the audit log).
	DigestKey *audit.DigestKey
	// Now replaces the clock of request timing and of the failed-authentication limit (tests).
	Now func() time.Time
}

// Server implements envoy.service.ext_proc.v3.ExternalProcessor.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	opts     Options
	auth     *authGuard
	bodies   bodyBudget
	receive  receiveGate
	director *director.Director
	metrics  *director.Metrics // the director's series, which the protocol stage shares
	// unknownEdge is set once an Envoy named a region the policy does not have, so the mistake is logged once.
	unknownEdge atomic.Bool
}

// New builds a Server; Policies is required.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	d := opts.Director
	if d == nil {
		d = director.New(director.Options{Policies: opts.Policies, Logger: opts.Logger, Now: opts.Now})
	}
	if err := netturn.Start(); err != nil {
		opts.Logger.Warn("large bodies will not give the network its turn", "err", err)
	}
	// The large bodies received and parsed at once: room for the largest, or a sixteenth of the budget for
	// bodies in flight, as the policy sets them at start (see RELIABILITY.md, "Hostile bodies").
	g := opts.Policies.Current().Gateway()
	return &Server{opts: opts, auth: newAuthGuard(opts.Now), director: d, metrics: d.Metrics(),
		receive: newReceiveGate(max(g.MaxBodyBytesInFlight/16, g.MaxRequestBodyBytes))}
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
		// Let Envoy send an ordinary prompt without waiting for window updates (with grpc-go's 64 KiB starting
		// window a 256 KiB body costs several round trips before BDP probing catches up), yet hold a large body
		// the receive gate has not admitted to half a MiB in this process (receiveGate).
		grpc.InitialWindowSize(512 << 10),
		grpc.InitialConnWindowSize(64 << 20),
		// Body-sized messages: see BufferPool.
		experimental.BufferPool(sharedBufferPool),
		// A large BUFFERED body is gathered in slices that give way, and copied once: see bodyCodec.
		grpc.ForceServerCodecV2(newBodyCodec()),
	}
}

// sharedBufferPool is gRPC's and the bodies' pool (an interface so that a test can count what it lends).
var sharedBufferPool mem.BufferPool = &BufferPool{}

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
	m := s.metrics
	m.ActiveStreams.Inc()
	defer m.ActiveStreams.Dec()
	rs := &requestState{srv: s, ctx: stream.Context(), deferSettle: true, edgeRegion: edgeRegion(stream.Context())}
	defer rs.close()
	for {
		// Into the request state, which is on the heap already (RecvMsg's argument escapes); emptied by
		// dropReceived once the message is answered.
		if err := stream.RecvMsg(&rs.in); err != nil {
			return endOfStream(err)
		}
		out := rs.handle(rs.in.req)
		for i, resp := range out {
			if i > 0 && len(rs.body) > largeBodyBytes {
				netturn.Yield() // a large body's answer goes back in chunks, which give way: netturn
			}
			if err := rs.send(stream, resp); err != nil {
				return err
			}
		}
		rs.sent()
		rs.dropReceived()
		if !rs.finished && rs.awaitBody > 0 {
			rs.admitBody()
		}
		if rs.finished {
			// An immediate response ends processing; closing the stream with OK tells Envoy we are done.
			if rs.finishing != nil {
				return stream.Send(rs.finishing)
			}
			return nil
		}
	}
}
