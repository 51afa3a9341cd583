// Package fleetsim simulates a fleet of GPU model servers well enough that routing changes latency the way it
// does on real hardware: each replica speaks the vLLM OpenAI API and metrics, keeps a block-level prefix KV
// cache, batches continuously, and shares one prefill throughput between concurrent prompts, so a cache miss
// slows everyone on that replica. A fake managed API (TLS, bearer key, its own model name) stands in for
// Together or Fireworks. Everything binds 127.0.0.1 and runs faster than real time by a time scale.
package fleetsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"gopkg.in/yaml.v3"
)

// Config is a fleet file.
type Config struct {
	// TimeScale is real seconds per simulated second: 0.1 runs ten times faster than the hardware.
	TimeScale float64         `yaml:"timeScale"`
	AdminAddr string          `yaml:"adminAddr"`
	Replicas  []ReplicaConfig `yaml:"replicas"`
	Managed   []ManagedConfig `yaml:"managed"`
}

// LoadConfig reads a fleet file strictly.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read fleet: %w", err)
	}
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("fleet %s: %w", path, err)
	}
	if c.TimeScale <= 0 {
		c.TimeScale = 1
	}
	return c, nil
}

// Fleet is a running simulated fleet.
type Fleet struct {
	Replicas []*Replica
	Managed  []*Managed
	admin    *http.Server
	adminLis net.Listener
}

// Start runs every replica and managed API in cfg until ctx ends.
func Start(ctx context.Context, cfg Config) (*Fleet, error) {
	f := &Fleet{}
	for _, rc := range cfg.Replicas {
		r, err := NewReplica(rc, cfg.TimeScale)
		if err != nil {
			return nil, err
		}
		if err := r.Start(ctx); err != nil {
			return nil, err
		}
		f.Replicas = append(f.Replicas, r)
	}
	for _, mc := range cfg.Managed {
		m, err := StartManaged(ctx, mc, cfg.TimeScale)
		if err != nil {
			return nil, err
		}
		f.Managed = append(f.Managed, m)
	}
	if cfg.AdminAddr != "" {
		lis, err := net.Listen("tcp", cfg.AdminAddr)
		if err != nil {
			return nil, fmt.Errorf("fleet admin: %w", err)
		}
		f.adminLis = lis
		f.admin = &http.Server{Handler: f.adminHandler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = f.admin.Serve(lis) }()
		go func() { <-ctx.Done(); _ = f.admin.Close() }()
	}
	return f, nil
}

// AdminAddr is where the fault-injection endpoint listens, if configured.
func (f *Fleet) AdminAddr() string {
	if f.adminLis == nil {
		return ""
	}
	return f.adminLis.Addr().String()
}

// Replica finds a replica by name.
func (f *Fleet) Replica(name string) (*Replica, bool) {
	for _, r := range f.Replicas {
		if r.cfg.Name == name {
			return r, true
		}
	}
	return nil, false
}

// adminHandler serves PUT /faults/{replica} with a Faults JSON body, and GET /replicas.
func (f *Fleet) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /faults/{replica}", func(w http.ResponseWriter, req *http.Request) {
		r, ok := f.Replica(req.PathValue("replica"))
		if !ok {
			http.Error(w, "no such replica", http.StatusNotFound)
			return
		}
		var faults Faults
		if err := json.NewDecoder(req.Body).Decode(&faults); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := r.SetFaults(faults); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /replicas", func(w http.ResponseWriter, _ *http.Request) {
		out := map[string]string{}
		for _, r := range f.Replicas {
			out[r.cfg.Name] = r.Addr()
		}
		writeJSON(w, http.StatusOK, out)
	})
	return mux
}
