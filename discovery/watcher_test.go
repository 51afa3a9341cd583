package discovery

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/infergate/infergate/discovery/discoverytest"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/wait"
)

const policy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h100: {costPerHour: 2, prefillTokensPerSecond: 10000, decodeTokensPerSecond: 2000}
  models:
  - name: m
    pools:
    - {name: static, hardwareClass: h100, engine: vllm, endpoints: ["10.9.0.1:8000"]}
    - name: found
      hardwareClass: h100
      engine: vllm
      service: {namespace: inference, name: vllm-m, port: http}
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`

func ptr[T any](v T) *T { return &v }

// slice is an EndpointSlice of the vllm-m Service: its port http is 8000 and each endpoint has the conditions given.
func slice(name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "inference", Labels: map[string]string{discoveryv1.LabelServiceName: "vllm-m"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("metrics"), Port: ptr(int32(9100))}, {Name: ptr("http"), Port: ptr(int32(8000))}},
		Endpoints:   eps,
	}
}

func endpoint(ip string, ready, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(true), Terminating: ptr(terminating)}}
}

func poolEndpoints(store *policies.Store) []string {
	m, _ := store.Current().Model("m")
	return m.Pools[1].Endpoints
}

// The informers drive a pool's endpoints through add, update (not ready, terminating) and delete; the
// static pool keeps its own.
func TestWatcherFollowsEndpointSlices(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	store, err := policies.NewStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if eps := poolEndpoints(store); len(eps) != 0 {
		t.Fatalf("before discovery: %v", eps)
	}
	client, err := discoverytest.New(slice("vllm-m-a", endpoint("10.1.0.1", true, false), endpoint("10.1.0.2", false, false)),
		// Another Service's slice in the namespace is not this pool's.
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "inference", Labels: map[string]string{discoveryv1.LabelServiceName: "other"}},
			AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8000))}},
			Endpoints: []discoveryv1.Endpoint{endpoint("10.7.0.1", true, false)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := New(client, store, nil)
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Started: the first list is in the snapshot already.
	if eps := poolEndpoints(store); !slices.Equal(eps, []string{"10.1.0.1:8000"}) {
		t.Fatalf("after the first list: %v", eps)
	}
	versions := []string{store.Current().Version}
	api := client.EndpointSlices("inference")
	step := func(what string, want []string, do func() error) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatal(err)
		}
		wait.For(t, what, func() bool { return slices.Equal(poolEndpoints(store), want) })
		versions = append(versions, store.Current().Version)
	}
	step("a second slice added", []string{"10.1.0.1:8000", "10.1.0.3:8000"}, func() error {
		_, err := api.Create(ctx, slice("vllm-m-b", endpoint("10.1.0.3", true, false)), metav1.CreateOptions{})
		return err
	})
	step("a pod becomes ready, another starts terminating", []string{"10.1.0.2:8000", "10.1.0.3:8000"}, func() error {
		_, err := api.Update(ctx, slice("vllm-m-a", endpoint("10.1.0.1", true, true), endpoint("10.1.0.2", true, false)), metav1.UpdateOptions{})
		return err
	})
	step("a slice deleted", []string{"10.1.0.2:8000"}, func() error {
		return api.Delete(ctx, "vllm-m-b", metav1.DeleteOptions{})
	})
	m, _ := store.Current().Model("m")
	if !slices.Equal(m.Pools[0].Endpoints, []string{"10.9.0.1:8000"}) {
		t.Errorf("the static pool: %v", m.Pools[0].Endpoints)
	}
	for i := 1; i < len(versions); i++ {
		if versions[i] == versions[i-1] {
			t.Errorf("the snapshot version did not change with the endpoints: %v", versions)
		}
	}
}

func TestReadyHonoursConditionsAndPorts(t *testing.T) {
	s := slice("s", endpoint("10.0.0.1", true, false), endpoint("10.0.0.2", false, false), endpoint("10.0.0.3", true, true),
		discoveryv1.Endpoint{Addresses: []string{"10.0.0.4"}}) // no conditions: ready
	v6 := slice("v6", endpoint("fd00::1", true, false))
	v6.AddressType = discoveryv1.AddressTypeIPv6
	fqdn := slice("fqdn", endpoint("vllm.example", true, false))
	fqdn.AddressType = discoveryv1.AddressTypeFQDN
	got := Ready([]*discoveryv1.EndpointSlice{s, v6, fqdn}, "http")
	if want := []string{"10.0.0.1:8000", "10.0.0.4:8000", "[fd00::1]:8000"}; !slices.Equal(got, want) {
		t.Errorf("by name: %v, want %v", got, want)
	}
	if got := Ready([]*discoveryv1.EndpointSlice{s}, "9100"); !slices.Equal(got, []string{"10.0.0.1:9100", "10.0.0.4:9100"}) {
		t.Errorf("by number: %v", got)
	}
	if got := Ready([]*discoveryv1.EndpointSlice{s}, "grpc"); len(got) != 0 {
		t.Errorf("a port the slice lacks: %v", got)
	}
}
