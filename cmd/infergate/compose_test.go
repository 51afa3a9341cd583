package main

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/envoysim"
)

type composeFile struct {
	Services map[string]struct {
		Image string
		Build *struct {
			Context, Dockerfile string
		}
		Entrypoint  []string
		Command     []string
		Volumes     []string
		NetworkMode string   `yaml:"network_mode"`
		DependsOn   []string `yaml:"depends_on"`
	}
}

// TestDockerCompose checks deploy/compose against the code it runs, since no Docker runs here: every mounted
// file exists and parses (policy, fleet, Envoy bootstrap), infergate's and the simulator's arguments parse
// with the real flag sets, and the addresses agree — Envoy's ext_proc cluster is infergate's --extproc-addr,
// infergate's --redis-addr is Redis's port, the policy's endpoints are the fleet's replicas.
func TestDockerCompose(t *testing.T) {
	const dir = "../../deploy/compose"
	data, err := os.ReadFile(filepath.Join(dir, "docker-compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(data, &cf); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"redis", "fleet", "infergate", "envoy"} {
		if _, ok := cf.Services[name]; !ok {
			t.Fatalf("service %s missing", name)
		}
	}
	// hostFile maps a container path to the mounted host file.
	hostFile := func(service, containerPath string) string {
		t.Helper()
		for _, v := range cf.Services[service].Volumes {
			parts := strings.Split(v, ":")
			if len(parts) >= 2 && parts[1] == containerPath {
				p := filepath.Join(dir, parts[0])
				if _, err := os.Stat(p); err != nil {
					t.Fatalf("%s mounts %s: %v", service, parts[0], err)
				}
				return p
			}
		}
		t.Fatalf("%s: nothing mounted at %s", service, containerPath)
		return ""
	}
	for name, s := range cf.Services {
		if s.NetworkMode != "host" {
			t.Errorf("%s: network_mode %q; the quickstart addresses are 127.0.0.1 ports on the host", name, s.NetworkMode)
		}
		for _, d := range s.DependsOn {
			if _, ok := cf.Services[d]; !ok {
				t.Errorf("%s depends on unknown service %s", name, d)
			}
		}
		if s.Build != nil {
			df, err := os.ReadFile(filepath.Join(dir, s.Build.Context, s.Build.Dockerfile))
			if err != nil || !strings.Contains(string(df), "./cmd/infergate") {
				t.Errorf("%s: Dockerfile %s does not build ./cmd/infergate (%v)", name, s.Build.Dockerfile, err)
			}
		}
	}

	// infergate serve: flags parse; the policy is valid.
	ig := cf.Services["infergate"]
	if len(ig.Command) == 0 || ig.Command[0] != "serve" {
		t.Fatalf("infergate command %v", ig.Command)
	}
	var cfg serveConfig
	if err := serveFlags(&cfg, io.Discard).Parse(ig.Command[1:]); err != nil {
		t.Fatalf("infergate flags: %v", err)
	}
	snap, err := policies.LoadFile(hostFile("infergate", cfg.policy))
	if err != nil {
		t.Fatalf("policy: %v", err)
	}

	// Redis listens where infergate looks.
	redisPort := ""
	for i, a := range cf.Services["redis"].Command {
		if a == "--port" && i+1 < len(cf.Services["redis"].Command) {
			redisPort = cf.Services["redis"].Command[i+1]
		}
	}
	if _, port, _ := net.SplitHostPort(cfg.redisAddr); port == "" || port != redisPort {
		t.Errorf("--redis-addr %q, redis listens on port %q", cfg.redisAddr, redisPort)
	}

	// The simulator's fleet serves every endpoint the policy routes to.
	sim := cf.Services["fleet"]
	if !slices.Equal(sim.Entrypoint, []string{"/infergate-sim"}) || len(sim.Command) != 2 || sim.Command[0] != "--fleet" {
		t.Fatalf("fleet entrypoint %v command %v", sim.Entrypoint, sim.Command)
	}
	fleetCfg, err := fleetsim.LoadConfig(hostFile("fleet", sim.Command[1]))
	if err != nil {
		t.Fatalf("fleet: %v", err)
	}
	var served []string
	for _, r := range fleetCfg.Replicas {
		served = append(served, r.Addr)
	}
	for _, m := range snap.Policy.Spec.Models {
		for _, p := range m.Pools {
			for _, ep := range p.Endpoints {
				if !slices.Contains(served, ep) {
					t.Errorf("policy endpoint %s (pool %s) is not a fleet replica", ep, p.Name)
				}
			}
		}
	}

	// Envoy's bootstrap parses and calls infergate's ext_proc address.
	envoy := cf.Services["envoy"]
	if i := slices.Index(envoy.Command, "-c"); i < 0 || i+1 >= len(envoy.Command) {
		t.Fatalf("envoy command %v", envoy.Command)
	} else {
		raw, err := os.ReadFile(hostFile("envoy", envoy.Command[i+1]))
		if err != nil {
			t.Fatal(err)
		}
		bs, err := envoysim.ParseBootstrap(raw)
		if err != nil {
			t.Fatalf("envoy bootstrap: %v", err)
		}
		found := false
		for _, c := range bs.GetStaticResources().GetClusters() {
			for _, le := range c.GetLoadAssignment().GetEndpoints() {
				for _, e := range le.GetLbEndpoints() {
					sa := e.GetEndpoint().GetAddress().GetSocketAddress()
					if net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10)) == cfg.extprocAddr {
						found = true
					}
				}
			}
		}
		if !found {
			t.Errorf("no Envoy cluster points at infergate's --extproc-addr %s", cfg.extprocAddr)
		}
		// When Envoy takes its configuration over ADS, it asks infergate's --xds-addr.
		if ads := bs.GetDynamicResources().GetAdsConfig().GetGrpcServices(); len(ads) > 0 {
			name, ok := ads[0].GetEnvoyGrpc().GetClusterName(), false
			for _, c := range bs.GetStaticResources().GetClusters() {
				for _, le := range c.GetLoadAssignment().GetEndpoints() {
					for _, e := range le.GetLbEndpoints() {
						sa := e.GetEndpoint().GetAddress().GetSocketAddress()
						ok = ok || (c.GetName() == name && net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10)) == cfg.xdsAddr)
					}
				}
			}
			if !ok {
				t.Errorf("Envoy's ADS cluster %s does not point at infergate's --xds-addr %s", name, cfg.xdsAddr)
			}
		}
	}
}

// The minimum Envoy is one version everywhere: the compose file's image, the README, and the API
// deploy/envoy/minversion decodes every shipped and served configuration with.
func TestMinimumEnvoyIsStated(t *testing.T) {
	var cf composeFile
	data, err := os.ReadFile("../../deploy/compose/docker-compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &cf); err != nil {
		t.Fatal(err)
	}
	if img := cf.Services["envoy"].Image; img != "envoyproxy/envoy:v"+contract.MinimumEnvoy+"-latest" {
		t.Errorf("compose runs %s, not the minimum Envoy %s", img, contract.MinimumEnvoy)
	}
	gomod, err := os.ReadFile("../../deploy/envoy/minversion/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(gomod), "github.com/envoyproxy/go-control-plane/envoy v"+contract.MinimumEnvoy+".0") {
		t.Errorf("deploy/envoy/minversion does not decode with Envoy %s's API:\n%s", contract.MinimumEnvoy, gomod)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "Envoy "+contract.MinimumEnvoy+" or later") {
		t.Errorf("the README does not state Envoy %s or later", contract.MinimumEnvoy)
	}
}
