package main

import (
	"fmt"
	"log"
	"os"
	"strings"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/infergate/infergate/extproc"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/loadgen"
)

// benchPlacement measures what SLO placement costs per decision: the policy as it is (its tiers have TTFT
// targets, so the enterprise tenant's requests are placed by predicted timing and cost) against the same
// policy with routing.placement affinity, runs interleaved so both see the same machine. Target (issue #33):
// SLO placement's p99 at most 1.5× affinity's in every row.
func benchPlacement(policyPath string, runs int, scale float64, chunk int) {
	data, err := os.ReadFile(policyPath)
	if err != nil {
		log.Fatal(err)
	}
	slo, err := policies.Parse(policyPath, data)
	if err != nil {
		log.Fatal(err)
	}
	aff, err := policies.Parse(policyPath, []byte(strings.Replace(string(data), "\nspec:\n", "\nspec:\n  routing: {placement: affinity}\n", 1)))
	if err != nil || aff.Routing().Placement != policies.PlacementAffinity || slo.Routing().Placement != policies.PlacementSLO {
		log.Fatalf("the placement variants of %s: %v", policyPath, err)
	}
	sloClient, stopSLO := startProcessor(extproc.New(extproc.Options{Policies: policies.NewStaticStore(slo)}))
	defer stopSLO()
	affClient, stopAff := startProcessor(extproc.New(extproc.Options{Policies: policies.NewStaticStore(aff)}))
	defer stopAff()
	fmt.Println("\nDecision latency by placement mode (the same policy; medians of the runs):")
	fmt.Println("\n| prompt | body mode | concurrency | slo p50 | slo p99 | affinity p50 | affinity p99 | slo p99 / affinity p99 |")
	fmt.Println("|---:|---|---:|---:|---:|---:|---:|---:|")
	worst := 0.0
	for _, cfg := range []config{
		{promptBytes: 2 << 10, mode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, concurrency: 1, requests: max(64, int(4000*scale))},
		{promptBytes: 2 << 10, mode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, concurrency: 32, requests: max(64, int(4000*scale))},
		{promptBytes: 32 << 10, mode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, concurrency: 32, requests: max(64, int(2000*scale))},
	} {
		body := chatBody(cfg.promptBytes)
		var ss, as []result
		for range runs {
			s, err := measure(sloClient, cfg, body, chunk)
			if err != nil {
				log.Fatal(err)
			}
			a, err := measure(affClient, cfg, body, chunk)
			if err != nil {
				log.Fatal(err)
			}
			ss, as = append(ss, s), append(as, a)
		}
		s, a := medianResult(ss), medianResult(as)
		ratio := float64(s.p99) / float64(a.p99)
		worst = max(worst, ratio)
		fmt.Printf("| %d KiB | %s | %d | %s | %s | %s | %s | %.2f |\n", cfg.promptBytes>>10, modeName(cfg.mode), cfg.concurrency,
			fmtDur(s.p50), fmtDur(s.p99), fmtDur(a.p50), fmtDur(a.p99), ratio)
	}
	fmt.Println()
	loadgen.Check("SLO placement's decision p99 ≤ 1.5× affinity's, every row", worst <= 1.5, "worst %.2f×", worst)
}
