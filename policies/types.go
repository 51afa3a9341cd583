// Package policies holds the platform team's routing policy: the YAML they write, its strict loader with
// file:line errors, the immutable snapshot the request path reads, and hot reload that keeps the last good one.
package policies

import "time"

// APIVersion is the only policy schema version this build understands; a different value is refused so that a
// future, incompatible file is never half-read.
const APIVersion = "infergate.io/v1alpha1"

// Kind is the document kind a policy file must declare.
const Kind = "Policy"

// Policy is one policy document exactly as written in YAML. The request path never reads it directly: it reads
// the compiled Snapshot, so lookups are maps rather than scans.
type Policy struct {
	// APIVersion and Kind name the document: infergate.io/v1alpha1, Policy.
	APIVersion string `yaml:"apiVersion" json:"apiVersion" jsonschema:"enum=infergate.io/v1alpha1"`
	Kind       string `yaml:"kind" json:"kind" jsonschema:"enum=Policy"`
	// Metadata names the policy, for logs.
	Metadata *Metadata `yaml:"metadata,omitempty" json:"metadata,omitempty"`
	// Spec is the policy itself.
	Spec Spec `yaml:"spec" json:"spec"`
}

// Metadata names a policy so that logs and metrics can say which one is live.
type Metadata struct {
	// Name is the policy's name, for logs and `infergate validate`.
	Name string `yaml:"name,omitempty" json:"name,omitempty"`
}

// Spec is the body of a policy: gateway limits, hardware, models with their pools, and tenants.
type Spec struct {
	// Gateway bounds what the gateway accepts and adds to requests (body size, output bound, choices).
	Gateway Gateway `yaml:"gateway,omitempty" json:"gateway,omitempty"`
	// Quotas says how tenants' quotas are kept: Redis, the fail mode, the conversation header.
	Quotas QuotaSettings `yaml:"quotas,omitempty" json:"quotas,omitempty"`
	// Routing tunes replica choice: the scorers' weights, bounded load, SLO placement.
	Routing Routing `yaml:"routing,omitempty" json:"routing,omitempty"`
	// HardwareClasses are the accelerators pools run on, by name: their price and speed.
	HardwareClasses map[string]HardwareClass `yaml:"hardwareClasses" json:"hardwareClasses"`
	// Tiers say which hardware classes and models tenants of each tier may use. When tiers are defined, every
	// tenant's tier must be one of them; without tiers a tenant's tier is only a label.
	Tiers map[string]Tier `yaml:"tiers,omitempty" json:"tiers,omitempty"`
	// SLO is the latency every request must meet to count as good, for tenants whose tier sets none.
	SLO *SLO `yaml:"slo,omitempty" json:"slo,omitempty"`
	// Admission, when set, holds requests that no endpoint has room for in a bounded priority queue per model,
	// then degrades or sheds them, instead of shedding them at once.
	Admission *Admission `yaml:"admission,omitempty" json:"admission,omitempty"`
	// Audit says how long the audit log (infergate serve --audit-log) keeps what it wrote.
	Audit Audit `yaml:"audit,omitempty" json:"audit,omitempty"`
	// Regions, when set, place the pools in geographic regions or on-prem sites: every pool names its region,
	// each gateway prefers its own (infergate serve --region) and fails over to the others in order, and tenants
	// or tiers may be pinned to some (residency). docs/regions.md.
	Regions []Region `yaml:"regions,omitempty" json:"regions,omitempty"`
	// Models are what clients may ask for, each with its pools of replicas and its fallbacks.
	Models []Model `yaml:"models" json:"models"`
	// Tenants are who may call: their keys, models, tier and quotas.
	Tenants []Tenant `yaml:"tenants" json:"tenants"`
}

// Gateway holds request-path limits that apply to every tenant. Zero values take the defaults below, so a
// minimal policy stays short.
type Gateway struct {
	// MaxRequestBodyBytes bounds what the processor buffers per request; larger bodies get a 413.
	MaxRequestBodyBytes int64 `yaml:"maxRequestBodyBytes,omitempty" json:"maxRequestBodyBytes,omitempty" jsonschema:"minimum=1024"`
	// MaxBodyBytesInFlight bounds the request bodies the processor holds at once, across every request it has
	// not routed yet: past it a body is refused with 503 and retry-after as it arrives, so bodies sent faster
	// than they are routed cannot grow the process past its memory limit. At least maxRequestBodyBytes.
	MaxBodyBytesInFlight int64 `yaml:"maxBodyBytesInFlight,omitempty" json:"maxBodyBytesInFlight,omitempty" jsonschema:"minimum=1024"`
	// MaxEndpointsPerDecision bounds the x-gateway-destination-endpoint list (chosen endpoint plus retry fallbacks).
	MaxEndpointsPerDecision int `yaml:"maxEndpointsPerDecision,omitempty" json:"maxEndpointsPerDecision,omitempty" jsonschema:"minimum=1,maximum=16"`
	// DefaultMaxTokens is the output bound for requests that set no max_tokens: admission reserves it and the
	// gateway writes it into the body as max_tokens, so the engine cannot produce more than was charged.
	DefaultMaxTokens int `yaml:"defaultMaxTokens,omitempty" json:"defaultMaxTokens,omitempty" jsonschema:"minimum=1"`
	// MaxChoices caps how many sequences one request may ask the engine for (n, and best_of on completions):
	// each is reserved against the tenant's token limits, and a request over the cap gets a 400.
	MaxChoices int `yaml:"maxChoices,omitempty" json:"maxChoices,omitempty" jsonschema:"minimum=1,maximum=128"`
	// UpstreamIdleTimeout is how long Envoy lets an attempt go without a byte from the replica, e.g. "60s": a
	// hung engine then costs its requests a 408 (or a reset mid-stream) instead of the five-minute route
	// timeout. Long enough for a queued prompt's time to first token.
	UpstreamIdleTimeout string `yaml:"upstreamIdleTimeout,omitempty" json:"upstreamIdleTimeout,omitempty"`
	// TenantHeader, when true, passes x-infergate-tenant upstream so replicas can log who asked.
	TenantHeader bool `yaml:"tenantHeader,omitempty" json:"tenantHeader,omitempty"`
	// ResponseModel is the "model" responses carry: "served" (default) passes the engine's or provider's name
	// through, as OpenAI answers with the resolved model; "requested" answers with the name the client sent
	// (an alias stays an alias), for clients that compare the two.
	ResponseModel string `yaml:"responseModel,omitempty" json:"responseModel,omitempty" jsonschema:"enum=served,enum=requested"`
}

// Response model choices.
const (
	ResponseModelServed    = "served"
	ResponseModelRequested = "requested"
)

// Defaults for Gateway fields left at zero.
const (
	DefaultMaxRequestBodyBytes     = 4 << 20
	DefaultMaxBodyBytesInFlight    = 128 << 20
	DefaultMaxEndpointsPerDecision = 3
	DefaultMaxTokens               = 256
	DefaultMaxChoices              = 16
	DefaultContextTokens           = 131072
	DefaultUpstreamIdleTimeout     = 60 * time.Second
)

// Routing tunes the picker. Zero values take the defaults below.
type Routing struct {
	// MaxWaiting is the engine queue depth at which an endpoint counts as saturated.
	MaxWaiting int `yaml:"maxWaiting,omitempty" json:"maxWaiting,omitempty" jsonschema:"minimum=1"`
	// MaxKVUtilisation is the KV-cache usage (0..1) at which an endpoint counts as saturated.
	MaxKVUtilisation float64 `yaml:"maxKVUtilisation,omitempty" json:"maxKVUtilisation,omitempty" jsonschema:"exclusiveMinimum=0,maximum=1"`
	// Weights weigh the picker's scorers by name (the table in picker/scorers: prefix, load, prefill, lora): a
	// candidate's score is the weighted sum of its scorers' scores. A scorer left out takes its default weight
	// (prefix 2, load 1, prefill 1, lora 1); 0 turns it off.
	Weights map[string]float64 `yaml:"weights,omitempty" json:"weights,omitempty"`
	// PrefixWeight and LoadWeight are the older spelling of weights.prefix and weights.load, kept so policies
	// written for it still load: either set takes both as written (the other then 0), as it always did.
	PrefixWeight float64 `yaml:"prefixWeight,omitempty" json:"prefixWeight,omitempty" jsonschema:"minimum=0"`
	LoadWeight   float64 `yaml:"loadWeight,omitempty" json:"loadWeight,omitempty" jsonschema:"minimum=0"`
	// BoundedLoadEpsilon: endpoints above (1+ε) × the mean load are skipped.
	BoundedLoadEpsilon float64 `yaml:"boundedLoadEpsilon,omitempty" json:"boundedLoadEpsilon,omitempty" jsonschema:"minimum=0"`
	// PrefillWeight and LoRAWeight are the older spelling of weights.prefill and weights.lora.
	PrefillWeight *float64 `yaml:"prefillWeight,omitempty" json:"prefillWeight,omitempty" jsonschema:"minimum=0"`
	LoRAWeight    *float64 `yaml:"loraWeight,omitempty" json:"loraWeight,omitempty" jsonschema:"minimum=0"`
	// DebugScores returns every candidate's scores to the client in the x-infergate-scores response header.
	// For tuning; it shows endpoint addresses, so keep it off where clients are not trusted.
	DebugScores bool `yaml:"debugScores,omitempty" json:"debugScores,omitempty"`
	// Placement is how a request with a TTFT target chooses among endpoints: "slo" (the default) keeps those
	// predicted to meet the target and takes the cheapest of them, prefix affinity counted in the cost; "affinity"
	// ranks by the scores alone, cost only breaking ties (what infergate did before SLO placement).
	Placement string `yaml:"placement,omitempty" json:"placement,omitempty" jsonschema:"enum=slo,enum=affinity"`
	// RegionFailback is how long a region whose pools were down (none with fresh metrics) must stay up before
	// requests prefer it again, e.g. "10s" (default 10s): a region that flickers does not pull traffic back and
	// forth.
	RegionFailback string `yaml:"regionFailback,omitempty" json:"regionFailback,omitempty"`
	// SLOMargin is the most of the TTFT target a prediction, taken at the tail of the endpoint's spread, may use
	// and still count as meeting it (default 0.8): what the spread does not show (bursts after the decision)
	// needs room too. Each pool's calibration only tightens it.
	SLOMargin float64 `yaml:"sloMargin,omitempty" json:"sloMargin,omitempty" jsonschema:"exclusiveMinimum=0,maximum=1"`
}

// Placement modes (routing.placement).
const (
	PlacementSLO      = "slo"
	PlacementAffinity = "affinity"
)

// Routing defaults.
const (
	DefaultMaxWaiting         = 64
	DefaultMaxKVUtilisation   = 0.97
	DefaultBoundedLoadEpsilon = 0.5
	DefaultSLOMargin          = 0.8
)

// QuotaSettings say how quotas are enforced across gateway replicas.
type QuotaSettings struct {
	// FailMode is what admission does when Redis is down or slow: "open" admits under an in-process limiter
	// at limit ÷ gatewayReplicas, "closed" answers 503.
	FailMode string `yaml:"failMode,omitempty" json:"failMode,omitempty" jsonschema:"enum=open,enum=closed"`
	// RedisTimeout bounds one Redis call on the request path, e.g. "50ms".
	RedisTimeout string `yaml:"redisTimeout,omitempty" json:"redisTimeout,omitempty"`
	// GatewayReplicas is how many infergate replicas share the limits, for the fail-open local limiter.
	GatewayReplicas int `yaml:"gatewayReplicas,omitempty" json:"gatewayReplicas,omitempty" jsonschema:"minimum=1"`
	// ConversationHeader names the request header that identifies a conversation for conversationTokens caps.
	ConversationHeader string `yaml:"conversationHeader,omitempty" json:"conversationHeader,omitempty"`
	// LeaseFraction is the share of each limit the gateway replicas together may reserve in Redis ahead of
	// requests and admit from in process, without a Redis round trip (default 0.05; 0: every request asks
	// Redis). Leases never let a limit overshoot; they can hold back up to this share of it from a replica
	// that has none left, for at most a couple of seconds.
	LeaseFraction *float64 `yaml:"leaseFraction,omitempty" json:"leaseFraction,omitempty" jsonschema:"minimum=0,maximum=0.5"`
}

// Quota fail modes.
const (
	FailOpen   = "open"
	FailClosed = "closed"
)

// Quota defaults.
const (
	DefaultRedisTimeout    = 50 * time.Millisecond
	DefaultGatewayReplicas = 1
	DefaultLeaseFraction   = 0.05
)

// HardwareClass describes one GPU type; its speeds feed routing and capacity weights, its price feeds cost.
type HardwareClass struct {
	// CostPerHour is the price of one replica-hour in USD: with the decode speed it gives the cost per token
	// that breaks ties between equally good endpoints.
	CostPerHour float64 `yaml:"costPerHour" json:"costPerHour" jsonschema:"minimum=0"`
	// PrefillTokensPerSecond and DecodeTokensPerSecond are one replica's speeds (prompt tokens computed, output
	// tokens generated per second), which SLO placement predicts latency from and cost per token divides by.
	PrefillTokensPerSecond float64 `yaml:"prefillTokensPerSecond" json:"prefillTokensPerSecond" jsonschema:"exclusiveMinimum=0"`
	DecodeTokensPerSecond  float64 `yaml:"decodeTokensPerSecond" json:"decodeTokensPerSecond" jsonschema:"exclusiveMinimum=0"`
	// GPUModel names the accelerator (a GPUPresets key: a100, h100, h200, l40s, mi300x) for `infergate plan`,
	// which sizes KV cache and speed from its memory, bandwidth and FLOPS. Routing does not use it.
	GPUModel string `yaml:"gpu,omitempty" json:"gpu,omitempty"`
	// GPUsPerReplica is the tensor-parallel degree of one replica of the class (default 1); CostPerHour is
	// the price of the whole replica.
	GPUsPerReplica int `yaml:"gpusPerReplica,omitempty" json:"gpusPerReplica,omitempty" jsonschema:"minimum=0,maximum=64"`
	// GPUMemoryGiB, MemoryBandwidthTBps, BF16TFLOPS and FP8TFLOPS override the preset's figures per GPU, or
	// describe an accelerator without a preset (then memory, bandwidth and BF16 are required).
	GPUMemoryGiB        float64 `yaml:"gpuMemoryGiB,omitempty" json:"gpuMemoryGiB,omitempty" jsonschema:"minimum=0"`
	MemoryBandwidthTBps float64 `yaml:"memoryBandwidthTBps,omitempty" json:"memoryBandwidthTBps,omitempty" jsonschema:"minimum=0"`
	BF16TFLOPS          float64 `yaml:"bf16TFLOPS,omitempty" json:"bf16TFLOPS,omitempty" jsonschema:"minimum=0"`
	FP8TFLOPS           float64 `yaml:"fp8TFLOPS,omitempty" json:"fp8TFLOPS,omitempty" jsonschema:"minimum=0"`
}

// Model is one model as clients name it, with the pools that serve it and the managed APIs behind them.
type Model struct {
	// Name is the model's canonical name, as clients ask for it.
	Name string `yaml:"name" json:"name" jsonschema:"minLength=1"`
	// Aliases are other names clients may use for the model.
	Aliases []string `yaml:"aliases,omitempty" json:"aliases,omitempty"`
	// Pricing is what tenants are charged per million tokens: spend quotas and the cost metrics use it.
	Pricing Pricing `yaml:"pricing,omitempty" json:"pricing,omitempty"`
	// ContextTokens is the engines' context window (vLLM --max-model-len): the largest max_tokens a request
	// may ask, and the cap on the bound injected into requests that ask none (default 131072).
	ContextTokens int64 `yaml:"contextTokens,omitempty" json:"contextTokens,omitempty" jsonschema:"minimum=1"`
	// Pools are the model's sets of identical replicas, one per hardware class or engine version.
	Pools []Pool `yaml:"pools" json:"pools" jsonschema:"minItems=1"`
	// Fallbacks are managed APIs that take the model's overflow, in order.
	Fallbacks []Fallback `yaml:"fallbacks,omitempty" json:"fallbacks,omitempty"`
	// Rollout, when set, releases a candidate pool or served model in steps gated on goodput (see Rollout).
	Rollout *Rollout `yaml:"rollout,omitempty" json:"rollout,omitempty"`
	// Disaggregation, when set, lets a request's prefill run on one replica and its decode on another, the KV
	// cache moved between them (docs/disaggregation.md); the pools' roles say which may do which.
	Disaggregation *Disaggregation `yaml:"disaggregation,omitempty" json:"disaggregation,omitempty"`
	// Adapters are LoRA adapters every pool of the model can serve (vLLM --lora-modules), named as clients
	// call them. A request for an adapter keeps its name upstream, prefers endpoints that have it loaded, and
	// never overflows to a managed fallback, which does not have it.
	Adapters []string `yaml:"adapters,omitempty" json:"adapters,omitempty"`
}

// Pricing is what a tenant is charged, per million tokens, in USD.
type Pricing struct {
	// InputPerMTok and OutputPerMTok are USD per million prompt and output tokens.
	InputPerMTok  float64 `yaml:"inputPerMTok,omitempty" json:"inputPerMTok,omitempty" jsonschema:"minimum=0"`
	OutputPerMTok float64 `yaml:"outputPerMTok,omitempty" json:"outputPerMTok,omitempty" jsonschema:"minimum=0"`
}

// Pool is a set of identical replicas of one model on one hardware class: one Envoy cluster.
type Pool struct {
	// Name names the pool's Envoy cluster (pool/<model>/<name>) and its metrics.
	Name string `yaml:"name" json:"name" jsonschema:"minLength=1"`
	// HardwareClass names one of spec.hardwareClasses: what the replicas run on.
	HardwareClass string `yaml:"hardwareClass" json:"hardwareClass"`
	// Engine is what the replicas run; it decides the metrics dialect that is scraped. The names allowed are
	// fleet.EngineNames() (validation and the JSON Schema's enum both read that registry).
	Engine string `yaml:"engine" json:"engine"`
	// ServedModel is the name the engine was started with; the request body is rewritten to it when it differs.
	ServedModel string `yaml:"servedModel,omitempty" json:"servedModel,omitempty"`
	// Endpoints are the replicas as ip:port; they become EDS endpoints and x-gateway-destination-endpoint values.
	// With Service, they are discovered instead (and the field must be left out).
	Endpoints []string `yaml:"endpoints,omitempty" json:"endpoints,omitempty"`
	// Service, instead of Endpoints, names the Kubernetes Service whose EndpointSlices list the replicas:
	// infergate watches them, and a replica that is not ready or is terminating takes no new request.
	Service *ServiceRef `yaml:"service,omitempty" json:"service,omitempty"`
	// MaxConcurrency is how many requests one replica runs at once (vLLM --max-num-seqs, SGLang
	// --max-running-requests). With spec.admission, it lets a tier whose headroom is below 1 leave batch slots
	// free for higher tiers, so their requests start at once instead of behind a lower tier's in the engine's
	// queue; without it, headroom applies to routing.maxWaiting alone.
	MaxConcurrency int `yaml:"maxConcurrency,omitempty" json:"maxConcurrency,omitempty" jsonschema:"minimum=0"`
	// PrefillTokensPerSecond and DecodeTokensPerSecond are this model's speeds on the pool's hardware when they
	// differ from the class's (which are stated for the class's usual model): a 7B model prefills several times
	// faster than a 70B one on the same GPU. They feed the TTFT prediction and the cost per token.
	PrefillTokensPerSecond float64 `yaml:"prefillTokensPerSecond,omitempty" json:"prefillTokensPerSecond,omitempty" jsonschema:"minimum=0"`
	DecodeTokensPerSecond  float64 `yaml:"decodeTokensPerSecond,omitempty" json:"decodeTokensPerSecond,omitempty" jsonschema:"minimum=0"`
	// Role is what the pool's replicas do when the model disaggregates prefill from decode (spec.models[].
	// disaggregation, docs/disaggregation.md): both (default), prefill (they only prefill for a decode replica,
	// and take no whole request) or decode (they take whole requests, and decode disaggregated ones).
	Role string `yaml:"role,omitempty" json:"role,omitempty" jsonschema:"enum=both,enum=prefill,enum=decode"`
	// EngineEndpoints, on a pool that decodes for a disaggregated model, reach its replicas' engines past llm-d's
	// routing sidecar (vLLM's own port), one for each of Endpoints, in the same order. A split request whose
	// prefill leg fails (the sidecar answers the prefiller's error) is retried on its decode replica's engine,
	// which prefills it itself: a failing prefiller costs time, not the request (docs/disaggregation.md).
	EngineEndpoints []string `yaml:"engineEndpoints,omitempty" json:"engineEndpoints,omitempty"`
	// Region names one of spec.regions: where the replicas run. Required when the policy has regions.
	Region string `yaml:"region,omitempty" json:"region,omitempty"`
}

// EngineEndpoint is the engine behind endpoint ep's sidecar (Pool.EngineEndpoints), "" when the pool names none.
func (p *Pool) EngineEndpoint(ep string) string {
	if len(p.EngineEndpoints) != len(p.Endpoints) {
		return ""
	}
	for i, e := range p.Endpoints {
		if e == ep {
			return p.EngineEndpoints[i]
		}
	}
	return ""
}

// Pool roles.
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// ServesWhole says whether the pool takes whole requests (prefill and decode on one replica): every pool but a
// prefill-only one.
func (p *Pool) ServesWhole() bool { return p.Role != RolePrefill }

// Prefills says whether the pool can prefill for a decode replica of another.
func (p *Pool) Prefills() bool { return p.Role != RoleDecode }

// ServiceRef names a Kubernetes Service and the port of its EndpointSlices that serves the engine's API.
type ServiceRef struct {
	// Namespace and Name are the Service's.
	Namespace string `yaml:"namespace" json:"namespace" jsonschema:"minLength=1"`
	Name      string `yaml:"name" json:"name" jsonschema:"minLength=1"`
	// Port is the EndpointSlice port's name (e.g. "http"), or its number when it has none.
	Port string `yaml:"port" json:"port" jsonschema:"minLength=1"`
	// EnginePort, on a pool that decodes for a disaggregated model, is the EndpointSlice port (name or number)
	// of each replica's engine past llm-d's routing sidecar (vLLM's own port): a split request whose prefill leg
	// fails is retried there, as with a static pool's engineEndpoints.
	EnginePort string `yaml:"enginePort,omitempty" json:"enginePort,omitempty"`
}

// watched is the reference the EndpointSlice watcher keys a port by.
func (r ServiceRef) watched(port string) ServiceRef {
	return ServiceRef{Namespace: r.Namespace, Name: r.Name, Port: port}
}

// Fallback conditions: when the self-hosted pools cannot take a request.
const (
	WhenSaturated   = "saturated"
	WhenUnavailable = "unavailable"
	// WhenSLO sends a request to the fallback when no self-hosted endpoint is predicted to meet its TTFT
	// target (routing.placement slo), though some could still take it.
	WhenSLO = "slo"
)

// Fallback is a managed API (Together, Fireworks, …) that takes a model's overflow.
type Fallback struct {
	// Name names the fallback's Envoy cluster (fallback/<model>/<name>).
	Name string `yaml:"name" json:"name" jsonschema:"minLength=1"`
	// BaseURL is the provider's OpenAI-compatible API, e.g. https://api.together.xyz/v1.
	BaseURL string `yaml:"baseURL" json:"baseURL" jsonschema:"format=uri"`
	// Model is the provider's name for the model; the body is rewritten to it on that leg.
	Model string `yaml:"model" json:"model" jsonschema:"minLength=1"`
	// APIKeyFrom says where the provider key lives ("env:NAME" or "file:/path"); the key itself is never in the policy.
	APIKeyFrom string `yaml:"apiKeyFrom" json:"apiKeyFrom" jsonschema:"pattern=^(env|file):.+"`
	// When says which overflow the fallback takes: saturated (every replica full), unavailable (none
	// healthy), slo (none predicted in time).
	When []string `yaml:"when" json:"when" jsonschema:"minItems=1,enum=saturated,enum=unavailable,enum=slo"`
	// Pricing is what the provider charges the platform per million tokens: the cost of overflow, which
	// placement weighs against the fleet's and reports.
	Pricing Pricing `yaml:"pricing,omitempty" json:"pricing,omitempty"`
	// CAFile is the PEM bundle, on Envoy's host, that an https baseURL's certificate must chain to (default
	// DefaultProviderCAFile, the system bundle): Envoy verifies the provider before it sends the key.
	CAFile string `yaml:"caFile,omitempty" json:"caFile,omitempty" jsonschema:"pattern=^/"`
	// Region names one of spec.regions where the provider keeps the data it is sent: a tenant pinned to regions
	// (residency) overflows only to a fallback in one of them. Without it the provider is outside every region
	// and takes no pinned tenant's request.
	Region string `yaml:"region,omitempty" json:"region,omitempty"`
}

// DefaultProviderCAFile is the system CA bundle of Debian-based images, Envoy's own among them.
const DefaultProviderCAFile = "/etc/ssl/certs/ca-certificates.crt"

// Tier is what tenants of one tier may use; an empty list allows everything of that kind.
type Tier struct {
	// HardwareClasses the tier's requests may be placed on (empty: every class).
	HardwareClasses []string `yaml:"hardwareClasses,omitempty" json:"hardwareClasses,omitempty"`
	// Models by canonical name or alias.
	Models []string `yaml:"models,omitempty" json:"models,omitempty"`
	// SLO is what a request of this tier's tenants must meet to count as good (default: spec.slo).
	SLO *SLO `yaml:"slo,omitempty" json:"slo,omitempty"`
	// Priority orders the admission queue: a waiting request of a higher priority always starts before one of a
	// lower (default 0; negative values are allowed).
	Priority int `yaml:"priority,omitempty" json:"priority,omitempty" jsonschema:"minimum=-1000,maximum=1000"`
	// MaxQueueWait is the longest a request of this tier waits for room, e.g. "500ms" (default: its TTFT target,
	// else spec.admission.maxQueueWait).
	MaxQueueWait string `yaml:"maxQueueWait,omitempty" json:"maxQueueWait,omitempty"`
	// MinShare is the share of the queue's starts this tier keeps while higher tiers wait (0 to 0.5, default 0:
	// strict priority), so that a sustained overload of a higher tier does not starve it.
	MinShare float64 `yaml:"minShare,omitempty" json:"minShare,omitempty" jsonschema:"minimum=0,maximum=0.5"`
	// Headroom is how full an endpoint may be, as a share (0 to 1, default 1), for this tier to add a request:
	// of the pool's maxConcurrency + routing.maxWaiting running and waiting requests of every tier, or of
	// routing.maxWaiting waiting ones where the pool states no maxConcurrency. Below 1, an endpoint is full for
	// this tier while higher tiers still find room. Every gateway replica reads the same engine queues, so the room kept back holds across
	// replicas.
	Headroom float64 `yaml:"headroom,omitempty" json:"headroom,omitempty" jsonschema:"exclusiveMinimum=0,maximum=1"`
	// Reserve keeps, per model (by name or alias), a share (0 to 1) of each of its endpoints' maxConcurrency +
	// routing.maxWaiting for this tier: tiers of lower priority leave what its requests in flight there do not
	// yet fill. Unlike a lower tier's headroom, which holds slots back whoever uses them, it asks nothing of
	// lower tiers while this tier holds its share, and it is there before this tier's demand rises, as an
	// overload that starts at once needs (docs/admission.md). It holds on the pools that state maxConcurrency
	// and that this tier may use (its hardwareClasses, inside its residency); the reserves on a pool add up to
	// at most 1.
	Reserve map[string]float64 `yaml:"reserve,omitempty" json:"reserve,omitempty"`
	// Residency pins the tier's requests to these regions (spec.regions): they are never placed on a pool or
	// sent to a fallback outside them, under any fault; a request that cannot be served inside gets a 503 naming
	// them.
	Residency []string `yaml:"residency,omitempty" json:"residency,omitempty"`
	// DegradeTo names, per model, the cheaper model a request of this tier is sent to when it cannot start in
	// time on its own.
	DegradeTo []Degrade `yaml:"degradeTo,omitempty" json:"degradeTo,omitempty"`
}

// Degrade is one model's stand-in when its endpoints are full.
type Degrade struct {
	// Model and To by canonical name or alias; the tier must be allowed To.
	Model string `yaml:"model" json:"model" jsonschema:"minLength=1"`
	To    string `yaml:"to" json:"to" jsonschema:"minLength=1"`
}

// Admission bounds the queue that holds requests no endpoint has room for. An endpoint has room while its
// engine's load, as last scraped plus what the gateways sent it since, is below the tier's headroom of the
// pool's maxConcurrency + routing.maxWaiting (of maxWaiting waiting requests without maxConcurrency), less the
// reserves above the tier (docs/admission.md): with admission on, set maxWaiting to 1 or 2 so that requests
// wait in the gateway, in priority order, rather than in the engines' FIFO.
type Admission struct {
	// MaxQueueLength bounds the requests waiting per model (default 1024).
	MaxQueueLength int `yaml:"maxQueueLength,omitempty" json:"maxQueueLength,omitempty" jsonschema:"minimum=1"`
	// MaxQueueBytes bounds the request bodies held per model (default 64 MiB).
	MaxQueueBytes int64 `yaml:"maxQueueBytes,omitempty" json:"maxQueueBytes,omitempty" jsonschema:"minimum=1024"`
	// MaxQueueWait is the longest any request waits, e.g. "2s" (default 5s).
	MaxQueueWait string `yaml:"maxQueueWait,omitempty" json:"maxQueueWait,omitempty"`
	// BufferedMessageTimeout is the ext_proc filter's message_timeout in the Envoy configs that send bodies
	// BUFFERED (default 2s, as shipped): a request in such a stream waits at most this less a margin, so that
	// it is degraded or shed before Envoy gives up with a 504.
	BufferedMessageTimeout string `yaml:"bufferedMessageTimeout,omitempty" json:"bufferedMessageTimeout,omitempty"`
}

// Admission defaults.
const (
	DefaultMaxQueueLength         = 1024
	DefaultMaxQueueBytes          = 64 << 20
	DefaultMaxQueueWait           = 5 * time.Second
	DefaultBufferedMessageTimeout = 2 * time.Second
	// BufferedWaitMargin is how long before a BUFFERED stream's message timeout its request leaves the queue.
	BufferedWaitMargin = 250 * time.Millisecond
)

// SLO is the per-request latency target behind goodput — the requests per second that complete within it —
// which is what a platform reports to its tenants. A request is good when it completed successfully and met
// both targets; a streamed one by its measured time to first token and time per output token, any other by
// its end-to-end time against the budget ttft + tpot × (completion tokens − 1). A target left out does not
// constrain.
type SLO struct {
	// TTFT is the time to first token a request must not exceed, e.g. "100ms".
	TTFT string `yaml:"ttft,omitempty" json:"ttft,omitempty"`
	// TPOT is the mean time per output token after the first a request must not exceed, e.g. "30ms".
	TPOT string `yaml:"tpot,omitempty" json:"tpot,omitempty"`
	// Objective is the share of requests that must be good (default 0.99): alerts burn error budget against it.
	Objective float64 `yaml:"objective,omitempty" json:"objective,omitempty" jsonschema:"exclusiveMinimum=0,exclusiveMaximum=1"`
	// Models override the targets for some models (a 70B model's first token takes longer than an 8B's).
	Models []ModelSLO `yaml:"models,omitempty" json:"models,omitempty"`
}

// ModelSLO overrides an SLO's targets for one model; a target it leaves out is the enclosing SLO's.
type ModelSLO struct {
	// Model by canonical name or alias.
	Model string `yaml:"model" json:"model" jsonschema:"minLength=1"`
	// TTFT and TPOT are the model's targets, e.g. "2s" and "80ms", in place of the tier's.
	TTFT string `yaml:"ttft,omitempty" json:"ttft,omitempty"`
	TPOT string `yaml:"tpot,omitempty" json:"tpot,omitempty"`
}

// DefaultSLOObjective is the share of good requests an SLO asks for when it names none.
const DefaultSLOObjective = 0.99

// Audit is the audit log's retention.
type Audit struct {
	// Retention is how long a tenant's rotated audit files are kept, e.g. "720h" (default: forever).
	Retention string `yaml:"retention,omitempty" json:"retention,omitempty"`
}

// Tenant is a customer of the platform: who they are (API key hashes), what they may use, and how much.
type Tenant struct {
	// Name is the tenant's name in metrics, audit files and logs.
	Name string `yaml:"name" json:"name" jsonschema:"minLength=1"`
	// Tier names one of spec.tiers: the tenant's hardware, models, SLO and queue priority.
	Tier string `yaml:"tier,omitempty" json:"tier,omitempty"`
	// APIKeys are "sha256:<hex>" digests of the bearer keys; plaintext keys never appear in a policy.
	APIKeys []string `yaml:"apiKeys" json:"apiKeys" jsonschema:"minItems=1"`
	// Models the tenant may call, by canonical name or alias; "*" allows every model.
	Models []string `yaml:"models" json:"models" jsonschema:"minItems=1"`
	// Quota limits the tenant across every model.
	Quota Quota `yaml:"quota,omitempty" json:"quota,omitempty"`
	// ModelQuotas add limits for this tenant on one model, on top of the tenant-wide quota.
	ModelQuotas []ModelQuota `yaml:"modelQuotas,omitempty" json:"modelQuotas,omitempty"`
	// QueueWeight is the tenant's share against the other tenants of its tier in the admission queue
	// (weighted fair queuing by tokens; default 1).
	QueueWeight float64 `yaml:"queueWeight,omitempty" json:"queueWeight,omitempty" jsonschema:"minimum=0"`
	// Residency pins the tenant's requests to these regions, as a tier's does; with both, the tenant's requests
	// stay within the regions both name.
	Residency []string `yaml:"residency,omitempty" json:"residency,omitempty"`
	// AuditRetention overrides spec.audit.retention for this tenant's audit files, e.g. "2160h" for a
	// customer whose contract asks for 90 days.
	AuditRetention string `yaml:"auditRetention,omitempty" json:"auditRetention,omitempty"`
}

// ModelQuota is a tenant's quota on one model.
type ModelQuota struct {
	// Model is the model the limits apply to, by canonical name or alias.
	Model string `yaml:"model" json:"model"`
	Quota `yaml:",inline" json:",inline"`
}

// Quota bounds a tenant's use of the fleet; a zero field means "no limit of that kind".
type Quota struct {
	// RequestsPerSecond, TokensPerMinute (prompt and output), MaxConcurrent (requests in flight) and
	// MonthlySpendUSD are the limits; 0 is none. A request over one gets a 429 with retry-after.
	RequestsPerSecond float64 `yaml:"requestsPerSecond,omitempty" json:"requestsPerSecond,omitempty" jsonschema:"minimum=0"`
	TokensPerMinute   int64   `yaml:"tokensPerMinute,omitempty" json:"tokensPerMinute,omitempty" jsonschema:"minimum=0"`
	MaxConcurrent     int     `yaml:"maxConcurrent,omitempty" json:"maxConcurrent,omitempty" jsonschema:"minimum=0"`
	MonthlySpendUSD   float64 `yaml:"monthlySpendUSD,omitempty" json:"monthlySpendUSD,omitempty" jsonschema:"minimum=0"`
	// ConversationTokens caps the tokens of one conversation (see quotas.conversationHeader).
	ConversationTokens int64 `yaml:"conversationTokens,omitempty" json:"conversationTokens,omitempty" jsonschema:"minimum=0"`
}
