package extproc

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
)

// The region an Envoy names on its stream (another region's Envoy whose ext_proc failed over here) is where the
// request is placed from, when the policy has it; a name it does not have is ignored and logged once.
func TestTheEnvoysRegionIsTakenWhenThePolicyHasIt(t *testing.T) {
	regional, err := policies.LoadFile("../examples/regions/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	plain, err := policies.LoadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	srv := &Server{opts: Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}}
	for _, tc := range []struct {
		name, metadata string
		snap           *policies.Snapshot
		want           string
	}{
		{"no metadata: this gateway's region", "", regional, ""},
		{"a region of the policy", "us-west", regional, "us-west"},
		{"a region the policy does not have", "mars", regional, ""},
		{"again", "mars", regional, ""},
		{"a policy without regions", "us-west", plain, ""},
	} {
		ctx := context.Background()
		if tc.metadata != "" {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(contract.EdgeRegionMetadata, tc.metadata))
		}
		rs := &requestState{srv: srv, snap: tc.snap, edgeRegion: edgeRegion(ctx)}
		if got := rs.edgeRegionOf(); got != tc.want {
			t.Errorf("%s: placed from %q, want %q", tc.name, got, tc.want)
		}
	}
	if n := strings.Count(logs.String(), "edge_region=mars"); n != 1 {
		t.Errorf("the unknown region was logged %d times, want once:\n%s", n, logs.String())
	}
}
