package fleetsim

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

var errTooLong = errors.New("prompt and max_tokens exceed the replica's KV capacity")

// Faults are failures injected into a replica at run time.
type Faults struct {
	ErrorRate float64 `json:"errorRate"` // fraction of inference requests answered with a 500
	Hang      bool    `json:"hang"`      // accept requests and never answer
	Slowdown  float64 `json:"slowdown"`  // multiply engine step times (1 = normal)
	Refuse    bool    `json:"refuse"`    // close the listener: connections are refused
}

// ReplicaConfig describes one simulated model server.
type ReplicaConfig struct {
	Name         string   `yaml:"name"`
	Addr         string   `yaml:"addr"`
	Model        string   `yaml:"model"`
	Hardware     string   `yaml:"hardware"`
	Dialect      string   `yaml:"dialect"` // vllm (default) or sglang
	BlockSize    int      `yaml:"blockSize"`
	NumGPUBlocks int      `yaml:"numGPUBlocks"`
	MaxNumSeqs   int      `yaml:"maxNumSeqs"`
	LoRAs        []string `yaml:"loras"`
	// MaxTokensDefault is the output length for requests that set no max_tokens.
	MaxTokensDefault int `yaml:"maxTokensDefault"`
	// Speed, when set, replaces the hardware profile's speeds: the profiles are for a 70B-class model, and a
	// 7B one on the same GPU runs several times faster.
	Speed *Hardware `yaml:"speed"`
	// EngineVersion, when set, is exported as the version label of <dialect>:build_info.
	EngineVersion string `yaml:"engineVersion"`
	// Sidecar gives the replica llm-d's routing sidecar: a request naming a prefiller in x-prefiller-host-port
	// is prefilled there, its KV cache pulled, and decoded here (disagg.go). KVBytesPerToken and TransferGbps
	// time the pull (0: instant; default 100 Gb/s).
	Sidecar bool `yaml:"sidecar"`
	// SidecarConnector is the sidecar's --kv-connector: nixlv2 (default: vLLM's two legs in turn) or sglang
	// (SGLang's PD fields, both legs at once; sglang.go).
	SidecarConnector string `yaml:"sidecarConnector"`
	// DisaggregationMode prefill makes the replica an SGLang server started with --disaggregation-mode prefill:
	// a request carrying bootstrap fields is prefilled for the decode server that shares its room.
	DisaggregationMode string `yaml:"disaggregationMode"`
	// EngineAddr, with Sidecar, is where the engine itself also listens, past the sidecar (vLLM's own port in a
	// decode pod): a request there runs whole, whatever its headers, as vLLM ignores llm-d's.
	EngineAddr      string  `yaml:"engineAddr"`
	KVBytesPerToken int64   `yaml:"kvBytesPerToken"`
	TransferGbps    float64 `yaml:"transferGbps"`
}

// Replica is one simulated vLLM- or SGLang-compatible server.
type Replica struct {
	cfg    ReplicaConfig
	eng    *engine
	reg    *prometheus.Registry
	ttft   prometheus.Histogram
	faults atomic.Pointer[Faults]
	reqID  atomic.Uint64
	// received counts the inference requests that reached the replica, answered or refused.
	received atomic.Int64
	// remotePrefills and prefillLegs count the two sides of disaggregated requests (disagg.go); legClient
	// sends the sidecar's prefill legs.
	remotePrefills, prefillLegs atomic.Int64
	legClient                   *http.Client
	created                     int64

	// Set for a managed API: TLS, a required bearer key and a fixed network delay.
	tlsConfig *tls.Config
	apiKey    string
	delay     time.Duration

	mu   sync.Mutex
	lis  net.Listener
	srv  *http.Server
	addr string
	// engineSrv and engineAddr serve ReplicaConfig.EngineAddr; engineServed counts the requests it took.
	engineSrv    *http.Server
	engineAddr   string
	engineServed atomic.Int64
	// bootstrapLegs counts the SGLang prefill-mode legs served (sglang.go).
	bootstrapLegs atomic.Int64
	inflight      sync.WaitGroup
}

// NewReplica builds a replica; Start binds it.
func NewReplica(cfg ReplicaConfig, timeScale float64) (*Replica, error) {
	hw, ok := Profiles[cfg.Hardware]
	if !ok {
		return nil, fmt.Errorf("replica %s: unknown hardware %q", cfg.Name, cfg.Hardware)
	}
	if cfg.Speed != nil {
		if cfg.Speed.PrefillTokensPerSecond <= 0 || cfg.Speed.DecodeStep <= 0 {
			return nil, fmt.Errorf("replica %s: speed needs prefillTokensPerSecond and decodeStep above zero", cfg.Name)
		}
		hw = *cfg.Speed
	}
	return newReplica(cfg, hw, timeScale), nil
}

func newReplica(cfg ReplicaConfig, hw Hardware, timeScale float64) *Replica {
	if cfg.NumGPUBlocks == 0 {
		cfg.NumGPUBlocks = 4096
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.Dialect == "" {
		cfg.Dialect = "vllm"
	}
	if cfg.MaxTokensDefault == 0 {
		cfg.MaxTokensDefault = 16
	}
	r := &Replica{cfg: cfg, created: time.Now().Unix(), legClient: &http.Client{}}
	r.eng = newEngine(EngineConfig{Hardware: hw, BlockSize: cfg.BlockSize, NumGPUBlocks: cfg.NumGPUBlocks,
		MaxNumSeqs: cfg.MaxNumSeqs, TimeScale: timeScale})
	r.faults.Store(&Faults{})
	r.reg = prometheus.NewRegistry()
	ttftName := "vllm:time_to_first_token_seconds"
	if cfg.Dialect == "sglang" {
		ttftName = "sglang:time_to_first_token_seconds"
	}
	r.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: ttftName, Help: "Histogram of time to first token in seconds (simulated time).",
		ConstLabels: prometheus.Labels{"model_name": cfg.Model},
		Buckets:     []float64{.001, .005, .01, .02, .04, .06, .08, .1, .25, .5, .75, 1, 2.5, 5, 7.5, 10},
	})
	// The histogram is collected by replicaCollector after it has observed the engine's new samples: the
	// registry collects collectors concurrently, so a separately registered histogram could be read first.
	r.reg.MustRegister(replicaCollector{r})
	return r
}

// Name is the replica's name from the fleet file.
func (r *Replica) Name() string { return r.cfg.Name }

// Addr is the address the replica listens on (host:port).
// Received is how many inference requests reached the replica (a provider's tests count them).
func (r *Replica) Received() int64 { return r.received.Load() }

func (r *Replica) Addr() string { r.mu.Lock(); defer r.mu.Unlock(); return r.addr }

// BusyTime is the simulated time the replica's engine has spent computing (0 for a managed API).
func (r *Replica) BusyTime() time.Duration {
	if r.eng == nil {
		return 0
	}
	return r.eng.busyTime()
}

// Start binds the listener and runs the engine until ctx ends.
func (r *Replica) Start(ctx context.Context) error {
	go r.eng.run(ctx)
	if err := r.listen(r.cfg.Addr); err != nil {
		return err
	}
	if r.cfg.Sidecar && r.cfg.EngineAddr != "" {
		if err := r.listenEngine(r.cfg.EngineAddr); err != nil {
			r.stopListening()
			return err
		}
	}
	go func() {
		<-ctx.Done()
		r.stopListening()
		if r.engineSrv != nil {
			_ = r.engineSrv.Close()
		}
	}()
	return nil
}

// listenEngine serves the engine past the sidecar: llm-d's header is not the engine's to read.
func (r *Replica) listenEngine(addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("replica %s engine: %w", r.cfg.Name, err)
	}
	h := r.handler()
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			req.Header.Del(headerPrefiller)
			if req.Method == http.MethodPost {
				r.engineServed.Add(1)
			}
			h.ServeHTTP(w, req)
		})}
	r.mu.Lock()
	r.engineSrv, r.engineAddr = srv, lis.Addr().String()
	r.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
	return nil
}

// EngineAddr is where the engine listens past the sidecar ("" without ReplicaConfig.EngineAddr).
func (r *Replica) EngineAddr() string { r.mu.Lock(); defer r.mu.Unlock(); return r.engineAddr }

// EngineServed counts the requests the engine took past the sidecar.
func (r *Replica) EngineServed() int64 { return r.engineServed.Load() }

func (r *Replica) listen(addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("replica %s: %w", r.cfg.Name, err)
	}
	r.mu.Lock()
	r.addr = lis.Addr().String()
	r.mu.Unlock()
	if r.tlsConfig != nil {
		lis = tls.NewListener(lis, r.tlsConfig)
	}
	// Connection-level errors (a proxy's connect probe closing before the TLS handshake) are not the
	// simulation's to report: they would print over the demo's table.
	srv := &http.Server{Handler: r.handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	r.mu.Lock()
	r.lis, r.srv = lis, srv
	r.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
	return nil
}

func (r *Replica) stopListening() {
	r.mu.Lock()
	srv := r.srv
	r.srv, r.lis = nil, nil
	r.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// SetFaults replaces the replica's injected faults. Refuse closes the listener; clearing it listens again on
// the same address.
func (r *Replica) SetFaults(f Faults) error {
	old := r.faults.Swap(&f)
	r.eng.setSlowdown(f.Slowdown)
	switch {
	case f.Refuse && !old.Refuse:
		r.stopListening()
	case !f.Refuse && old.Refuse:
		return r.listen(r.Addr())
	}
	return nil
}

func (r *Replica) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", r.inference)
	mux.HandleFunc("POST /v1/completions", r.inference)
	mux.HandleFunc("POST /v1/embeddings", r.inference)
	mux.HandleFunc("POST /v1/responses", r.inference)
	mux.HandleFunc("GET /v1/models", r.models)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{}))
	return mux
}

func (r *Replica) models(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
		Root    string `json:"root"`
	}
	data := []model{{ID: r.cfg.Model, Object: "model", Created: r.created, OwnedBy: "vllm", Root: r.cfg.Model}}
	for _, l := range r.cfg.LoRAs {
		data = append(data, model{ID: l, Object: "model", Created: r.created, OwnedBy: "vllm", Root: r.cfg.Model})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// apiRequest is the part of an OpenAI request body the simulator reads.
type apiRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Prompt        json.RawMessage `json:"prompt"`
	Input         json.RawMessage `json:"input"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           int `json:"max_tokens"`
	MaxCompletionTokens int `json:"max_completion_tokens"`
	// The Responses API's system prompt and output bound.
	Instructions    string `json:"instructions"`
	MaxOutputTokens int    `json:"max_output_tokens"`
	// N completions of the prompt (chat, completions); completions generate BestOf and return N of them.
	N      int `json:"n"`
	BestOf int `json:"best_of"`
	// KVTransfer is vLLM's kv_transfer_params: a prefill leg of a disaggregated request asks for it.
	KVTransfer *kvTransferParams `json:"kv_transfer_params"`
	// BootstrapRoom is SGLang's PD field: a prefill-mode server prefills the request for the decode server
	// that shares the room (sglang.go).
	BootstrapRoom *int64 `json:"bootstrap_room"`
}

// maxSequences bounds the sequences one request may ask the simulator for.
const maxSequences = 128

// vllmError writes vLLM's error envelope (integer code, class-like type).
func vllmError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"object": "error", "message": msg, "type": typ, "param": nil, "code": status})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (r *Replica) inference(w http.ResponseWriter, req *http.Request) {
	r.inflight.Add(1)
	defer r.inflight.Done()
	r.received.Add(1)
	if r.apiKey != "" && req.Header.Get("Authorization") != "Bearer "+r.apiKey {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"error": map[string]any{
			"message": "Invalid API key provided.", "type": "invalid_request_error", "code": "invalid_api_key"}})
		return
	}
	if r.delay > 0 {
		select {
		case <-time.After(r.delay):
		case <-req.Context().Done():
			return
		}
	}
	f := r.faults.Load()
	if f.Hang {
		<-req.Context().Done()
		return
	}
	if f.ErrorRate > 0 && rand.Float64() < f.ErrorRate {
		vllmError(w, http.StatusInternalServerError, "InternalServerError", "injected fault")
		return
	}
	var body apiRequest
	raw, err := io.ReadAll(http.MaxBytesReader(w, req.Body, 64<<20))
	if err == nil {
		err = json.Unmarshal(raw, &body)
	}
	if err != nil {
		vllmError(w, http.StatusBadRequest, "BadRequestError", "invalid JSON body: "+err.Error())
		return
	}
	if body.Model != r.cfg.Model && !contains(r.cfg.LoRAs, body.Model) {
		vllmError(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", body.Model))
		return
	}
	kind := strings.TrimPrefix(req.URL.Path, "/v1/")
	tokens := promptTokens(kind, &body)
	if len(tokens) == 0 {
		vllmError(w, http.StatusBadRequest, "BadRequestError", "empty prompt")
		return
	}
	if prefiller := req.Header.Get(headerPrefiller); prefiller != "" && r.cfg.Sidecar {
		leg := r.prefillLeg
		if r.cfg.SidecarConnector == ConnectorSGLang {
			leg = r.sglangPrefillLeg
		}
		if !leg(w, req, kind, raw, prefiller) || !r.pullKV(req.Context(), tokens) {
			return
		}
	}
	if body.BootstrapRoom != nil && r.cfg.DisaggregationMode == "prefill" {
		r.sglangPrefill(w, req, tokens)
		return
	}
	prefillLeg := body.KVTransfer != nil && body.KVTransfer.DoRemoteDecode
	if prefillLeg {
		r.prefillLegs.Add(1)
	}
	maxOut := body.MaxCompletionTokens
	if maxOut == 0 {
		maxOut = body.MaxOutputTokens
	}
	if maxOut == 0 {
		maxOut = body.MaxTokens
	}
	if maxOut == 0 {
		maxOut = r.cfg.MaxTokensDefault
	}
	if kind == "embeddings" {
		maxOut = 0
	}
	// As vLLM: n (and best_of) sequences of one prompt, each decoded up to maxOut; the prompt's blocks are
	// shared, so the sequences after the first find it cached.
	returned, generated := 1, 1
	if kind == "chat/completions" || kind == "completions" {
		returned = max(1, body.N)
		generated = max(returned, body.BestOf)
	}
	if generated > maxSequences {
		vllmError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf("n and best_of must be at most %d", maxSequences))
		return
	}
	seqs := make([]*seq, 0, generated)
	for range generated {
		s, err := r.eng.submit(req.Context(), tokens, maxOut)
		if err != nil {
			vllmError(w, http.StatusBadRequest, "BadRequestError", err.Error())
			return
		}
		seqs = append(seqs, s)
	}
	s := seqs[0]
	id := fmt.Sprintf("%s-%s-%d", map[string]string{"chat/completions": "chatcmpl", "completions": "cmpl", "embeddings": "embd",
		"responses": "resp"}[kind], r.cfg.Name, r.reqID.Add(1))
	switch {
	case kind == "responses":
		r.responses(w, req, s, body.Model, id, body.Stream)
	case kind == "embeddings":
		r.embeddings(w, req, s, body.Model, id)
	case body.Stream:
		r.stream(w, req, seqs, returned, kind, body.Model, id, body.StreamOptions != nil && body.StreamOptions.IncludeUsage)
	default:
		var kv *kvTransferParams
		if prefillLeg {
			p := r.prefilledFor(id)
			kv = &p
		}
		r.complete(w, req, seqs, returned, kind, body.Model, id, kv)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// promptTokens renders the prompt and splits it into whitespace tokens, the simulator's tokenizer.
func promptTokens(kind string, body *apiRequest) []string {
	var b strings.Builder
	switch kind {
	case "chat/completions":
		for _, m := range body.Messages {
			b.WriteString("<|" + m.Role + "|> ")
			b.WriteString(textOf(m.Content))
			b.WriteString(" ")
		}
		b.WriteString("<|assistant|>")
	case "completions":
		b.WriteString(textOf(body.Prompt))
	case "embeddings":
		b.WriteString(textOf(body.Input))
	case "responses":
		// As vLLM renders them: the instructions as the system message, then the input's messages.
		if body.Instructions != "" {
			b.WriteString("<|system|> " + body.Instructions + " ")
		}
		var items []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(body.Input, &items) == nil {
			for _, m := range items {
				b.WriteString("<|" + m.Role + "|> " + textOf(m.Content) + " ")
			}
		} else {
			b.WriteString("<|user|> " + textOf(body.Input) + " ")
		}
		b.WriteString("<|assistant|>")
	}
	return strings.Fields(b.String())
}

// textOf reads a string, an array of strings, or an array of content parts with "text".
func textOf(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []json.RawMessage
	if json.Unmarshal(raw, &parts) != nil {
		return ""
	}
	var out []string
	for _, p := range parts {
		if json.Unmarshal(p, &s) == nil {
			out = append(out, s)
			continue
		}
		var part struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(p, &part) == nil {
			out = append(out, part.Text)
		}
	}
	return strings.Join(out, " ")
}

var words = strings.Fields("the model answers with simulated tokens from a replica of the fleet")

func word(i int) string { return words[i%len(words)] + " " }

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func usageOf(s *seq) usage { return usageOfAll([]*seq{s}) }

// usageOfAll is one request's usage over its sequences: the prompt once, as the first sequence found it
// cached, and the output of every sequence generated (best_of's too).
func usageOfAll(seqs []*seq) usage {
	u := usage{PromptTokens: seqs[0].prompt}
	for _, s := range seqs {
		u.CompletionTokens += s.out
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	u.PromptTokensDetails.CachedTokens = seqs[0].cached
	return u
}

// wait drains the sequence's token channel; false when the client left first.
func wait(req *http.Request, s *seq) bool {
	for {
		select {
		case _, ok := <-s.tokens:
			if !ok {
				return req.Context().Err() == nil
			}
		case <-req.Context().Done():
			return false
		}
	}
}

func (r *Replica) complete(w http.ResponseWriter, req *http.Request, seqs []*seq, returned int, kind, model, id string, kv *kvTransferParams) {
	for _, s := range seqs {
		if !wait(req, s) {
			return
		}
	}
	resp := map[string]any{"id": id, "model": model, "created": time.Now().Unix(), "usage": usageOfAll(seqs)}
	choices := make([]any, 0, returned)
	for idx, s := range seqs[:returned] {
		var text strings.Builder
		for i := range s.out {
			text.WriteString(word(i))
		}
		if kind == "chat/completions" {
			choices = append(choices, map[string]any{"index": idx, "finish_reason": "length",
				"message": map[string]any{"role": "assistant", "content": text.String()}})
		} else {
			choices = append(choices, map[string]any{"index": idx, "finish_reason": "length", "text": text.String()})
		}
	}
	resp["choices"] = choices
	if kv != nil {
		resp["kv_transfer_params"] = kv // where the decoder pulls the prefilled blocks from
	}
	if kind == "chat/completions" {
		resp["object"] = "chat.completion"
	} else {
		resp["object"] = "text_completion"
	}
	w.Header().Set("x-simulated-replica", r.cfg.Name)
	writeJSON(w, http.StatusOK, resp)
}

func (r *Replica) embeddings(w http.ResponseWriter, req *http.Request, s *seq, model, id string) {
	if !wait(req, s) {
		return
	}
	vec := make([]float64, 8)
	for i := range vec {
		vec[i] = float64((s.prompt*31+i*17)%100) / 100
	}
	u := usageOf(s)
	w.Header().Set("x-simulated-replica", r.cfg.Name)
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "id": id, "model": model,
		"data":  []any{map[string]any{"object": "embedding", "index": 0, "embedding": vec}},
		"usage": map[string]any{"prompt_tokens": u.PromptTokens, "total_tokens": u.PromptTokens}})
}

func (r *Replica) stream(w http.ResponseWriter, req *http.Request, seqs []*seq, returned int, kind, model, id string, includeUsage bool) {
	ev := r.startEvents(w)
	created := time.Now().Unix()
	object := "chat.completion.chunk"
	if kind != "chat/completions" {
		object = "text_completion"
	}
	send := func(choices []any, u *usage) {
		b, _ := json.Marshal(map[string]any{"id": id, "model": model, "object": object, "created": created, "choices": choices, "usage": u})
		ev.data(b)
	}
	delta := func(idx, i int, finish any) []any {
		if kind == "chat/completions" {
			d := map[string]any{"content": word(i)}
			if i == 0 {
				d["role"] = "assistant"
			}
			return []any{map[string]any{"index": idx, "delta": d, "finish_reason": finish}}
		}
		return []any{map[string]any{"index": idx, "text": word(i), "finish_reason": finish}}
	}
	// One choice after another (each choice's events keep their order, which is all the format asks); the
	// sequences decode together in the engine meanwhile.
	for idx, s := range seqs[:returned] {
		if !eachToken(req, s, func(i int) { send(delta(idx, i, nil), nil) }) {
			return
		}
		if kind == "chat/completions" {
			send([]any{map[string]any{"index": idx, "delta": map[string]any{}, "finish_reason": "length"}}, nil)
		}
	}
	for _, s := range seqs[returned:] { // best_of's others: generated, not returned
		if !wait(req, s) {
			return
		}
	}
	if includeUsage {
		u := usageOfAll(seqs)
		send([]any{}, &u)
	}
	ev.data([]byte("[DONE]"))
}

// events writes a server-sent-events response, flushing each event as it goes.
type events struct {
	w       http.ResponseWriter
	flusher http.Flusher
}

// startEvents sends the headers of an event stream.
func (r *Replica) startEvents(w http.ResponseWriter) events {
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("x-simulated-replica", r.cfg.Name)
	w.WriteHeader(http.StatusOK)
	return events{w: w, flusher: flusher}
}

// event sends one event: its type line when typ is set, then its data.
func (e events) event(typ string, data []byte) {
	if typ != "" {
		_, _ = fmt.Fprintf(e.w, "event: %s\n", typ)
	}
	_, _ = fmt.Fprintf(e.w, "data: %s\n\n", data)
	if e.flusher != nil {
		e.flusher.Flush()
	}
}

func (e events) data(b []byte) { e.event("", b) }

// eachToken calls fn for every token the sequence produces, in order, and reports whether the sequence
// finished (false: the client left first).
func eachToken(req *http.Request, s *seq, fn func(i int)) bool {
	sent := 0
	for {
		select {
		case n, ok := <-s.tokens:
			if !ok {
				return req.Context().Err() == nil
			}
			for ; sent < n; sent++ {
				fn(sent)
			}
		case <-req.Context().Done():
			return false
		}
	}
}

// replicaCollector exports the engine's state under the dialect's metric names at scrape time.
type replicaCollector struct{ r *Replica }

func (c replicaCollector) Describe(chan<- *prometheus.Desc) {} // unchecked collector: names depend on the dialect

func (c replicaCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.r
	snap := r.eng.snapshot()
	for _, t := range snap.ttfts {
		r.ttft.Observe(t)
	}
	r.ttft.Collect(ch)
	model := prometheus.Labels{"model_name": r.cfg.Model}
	gauge := func(name, help string, v float64, labels prometheus.Labels) {
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, help, nil, labels), prometheus.GaugeValue, v)
	}
	counter := func(name, help string, v float64, labels prometheus.Labels) {
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, help, nil, labels), prometheus.CounterValue, v)
	}
	prefix := r.cfg.Dialect + ":"
	if v := r.cfg.EngineVersion; v != "" {
		gauge(prefix+"build_info", "The engine's build.", 1, prometheus.Labels{"version": v})
	}
	if r.cfg.Dialect == "sglang" {
		gauge("sglang:num_running_reqs", "The number of running requests.", float64(snap.running), model)
		gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", float64(snap.waiting), model)
		gauge("sglang:token_usage", "The token usage.", snap.kvUsage, model)
		gauge("sglang:cache_config_info", "Cache geometry.", 1, prometheus.Labels{
			"page_size": strconv.Itoa(r.cfg.BlockSize), "num_pages": strconv.Itoa(r.cfg.NumGPUBlocks)})
		counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", float64(snap.promptTokens), model)
		counter("sglang:generation_tokens_total", "Number of generation tokens processed.", float64(snap.genTokens), model)
		counter("sglang:cached_tokens_total", "Number of cached prompt tokens.", float64(snap.cacheHits), model)
		return
	}
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", float64(snap.running), model)
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", float64(snap.waiting), model)
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", snap.kvUsage, model)
	gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", 1, prometheus.Labels{
		"block_size": strconv.Itoa(r.cfg.BlockSize), "num_gpu_blocks": strconv.Itoa(r.cfg.NumGPUBlocks)})
	gauge("vllm:lora_requests_info", "Running stats on lora requests.", float64(r.created), prometheus.Labels{
		"max_lora": strconv.Itoa(len(r.cfg.LoRAs)), "running_lora_adapters": strings.Join(r.cfg.LoRAs, ","), "waiting_lora_adapters": ""})
	counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", float64(snap.cacheQueries), model)
	counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", float64(snap.cacheHits), model)
	counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", float64(snap.promptTokens), model)
	counter("vllm:generation_tokens_total", "Number of generation tokens processed.", float64(snap.genTokens), model)
	counter("vllm:request_success_total", "Count of successfully processed requests.", float64(snap.finished), model)
}
