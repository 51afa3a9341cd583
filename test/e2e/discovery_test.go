package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/infergate/infergate/discovery/discoverytest"
	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/test/wait"
)

// discoveryPolicy serves chat-8b from one pool that names a Kubernetes Service instead of listing endpoints.
const discoveryPolicy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h100: {costPerHour: 2.5, prefillTokensPerSecond: 60000, decodeTokensPerSecond: 6000}
  models:
  - name: chat-8b
    pools:
    - name: chat
      hardwareClass: h100
      engine: vllm
      servedModel: acme/chat-8b
      service: {namespace: inference, name: vllm-chat, port: http}
  tenants:
  - {name: app, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`

func ptr[T any](v T) *T { return &v }

// replicaSlice announces one simulated replica as an EndpointSlice of the vllm-chat Service (one slice each:
// every replica has its own port).
func replicaSlice(r *fleetsim.Replica, terminating bool) *discoveryv1.EndpointSlice {
	host, port, _ := net.SplitHostPort(r.Addr())
	p, _ := strconv.Atoi(port)
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "vllm-chat-" + r.Name(), Namespace: "inference", Labels: map[string]string{discoveryv1.LabelServiceName: "vllm-chat"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(p))}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{host},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(!terminating), Serving: ptr(true), Terminating: ptr(terminating)}}},
	}
}

// The simulated fleet's replicas are announced through EndpointSlices; one that starts terminating takes no
// new request, and once every slice is withdrawn the model has nowhere to go.
func TestPoolEndpointsFromKubernetes(t *testing.T) {
	client, err := discoverytest.New()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := stackFiles(t, map[string]string{"policy.yaml": discoveryPolicy, "envoy.yaml": "repo:deploy/envoy/envoy-xds.yaml",
		"fleet.yaml": "repo:examples/rollout/fleet.yaml"})
	slices := client.EndpointSlices("inference")
	var a, b *fleetsim.Replica
	st, err := Start(ctx, Options{Root: dir, EnvoyFile: "envoy.yaml", PolicyFile: "policy.yaml", FleetFile: "fleet.yaml",
		FreePorts: true, Kubernetes: client, BeforeGateway: func(f *fleetsim.Fleet) error {
			a, _ = f.Replica("chat-v1-0")
			b, _ = f.Replica("chat-v1-1")
			for _, r := range []*fleetsim.Replica{a, b} {
				if _, err := slices.Create(ctx, replicaSlice(r, false), metav1.CreateOptions{}); err != nil {
					return err
				}
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	send := func(i int) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, st.URL+"/v1/chat/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"chat-8b","max_tokens":2,"messages":[{"role":"user","content":"question %d"}]}`, i)))
		req.Header.Set("Authorization", "Bearer sk-demo-acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("x-simulated-replica")
	}
	served := map[string]int{}
	for i := range 40 {
		code, by := send(i)
		if code != http.StatusOK {
			t.Fatalf("request %d: %d", i, code)
		}
		served[by]++
	}
	if served["chat-v1-0"]+served["chat-v1-1"] != 40 {
		t.Fatalf("served by %v: not only the announced replicas", served)
	}

	if _, err := slices.Update(ctx, replicaSlice(a, true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the terminating replica to leave the pool", func() bool {
		m, _ := st.Policies.Current().Model("chat-8b")
		return len(m.Pools[0].Endpoints) == 1
	})
	before := a.Received()
	for i := range 20 {
		if code, by := send(100 + i); code != http.StatusOK || by != "chat-v1-1" {
			t.Fatalf("with chat-v1-0 terminating: %d from %q", code, by)
		}
	}
	if a.Received() != before {
		t.Errorf("the terminating replica received %d new requests", a.Received()-before)
	}

	for _, r := range []*fleetsim.Replica{a, b} {
		if err := slices.Delete(ctx, "vllm-chat-"+r.Name(), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, "every endpoint withdrawn", func() bool {
		m, _ := st.Policies.Current().Model("chat-8b")
		return len(m.Pools[0].Endpoints) == 0
	})
	if code, _ := send(999); code != http.StatusServiceUnavailable {
		t.Errorf("with no endpoint left: %d, want 503", code)
	}
}
