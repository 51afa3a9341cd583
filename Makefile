# infergate — run `make help` for the targets.
SHELL := /usr/bin/env bash
GO ?= go
BIN := bin/infergate
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME ?= 20s
# How long the fuzzer may shrink each new input. Go's default, 60s, spent whole runs shrinking one policy file
# (FuzzParse: 839 executions in 40 s, against 26,854 with 2s).
FUZZMINIMIZETIME ?= 2s
# The version `infergate version` prints: the commit (and +dirty) unless given.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
FUZZFLAGS ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build bin/infergate
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/infergate

.PHONY: test-deps
test-deps: ## install what the tests run for real (Debian packages) when missing
	@bash scripts/ensure-test-deps.sh

.PHONY: test
test: test-deps ## every test, vetted, with the race detector (but deploy/image and deploy/envoy/minversion, modules of their own); make lint vets the rest
	@# Every test binary is built (and vetted) first, so that no test runs beside the compiler on a cold cache.
	$(GO) test -race -vet=all -count=1 -run '^$$' ./...
	@# The race tests leave ~0.6 of the 2 cores idle. On that CPU, at the lowest priority (nice 19), the two
	@# modules built without the race detector (so sharing none of its build) compile in the background; their
	@# tests then run from the build cache on a quiet machine. A cold run on 2 idle cores: 16 min → 12-13 1/2.
	@nice -n 19 $(MAKE) --no-print-directory test-prebuild >/dev/null 2>&1 & \
	  $(MAKE) --no-print-directory test-race; rc=$$?; wait; exit $$rc
	cd deploy/envoy/minversion && $(GO) test -vet=all -count=1 ./...
	cd deploy/image && $(GO) test -vet=all -count=1 ./...

.PHONY: test-race
test-race: # make test's race-detector tests, after its build
	$(GO) test -race -vet=all -count=1 $$($(GO) list ./... | grep -v '/test/regionnet$$')
	@# The regions test runs after the rest (beside nothing but that background compile): its regions'
	@# processes would load the machine under the timing-sensitive tests of other packages (rollout gates,
	@# admission).
	$(GO) test -race -vet=all -count=1 ./test/regionnet
	@# The manifest checks under deploy/ run with the race detector too, and so does the chart's module, whose
	@# shared modules have the gateway's versions (its TestSharesTheGatewaysBuild): built without it, or with
	@# other versions, they would compile the ~900 packages they share with the rest a second time (3 1/2 min
	@# of a cold run, against 20 s).
	cd deploy/helm && $(GO) test -race -vet=all -count=1 ./...

.PHONY: test-prebuild
test-prebuild: # make test's background compile of what its last two steps test (errors show there)
	cd deploy/envoy/minversion && $(GO) test -vet=all -count=1 -run '^$$' ./...
	cd deploy/image && $(GO) test -vet=all -count=1 -run '^$$' ./...
	d=$$(mktemp -d) && (cd deploy/image && $(GO) run . -platforms linux/$$($(GO) env GOARCH) -out $$d/image); rc=$$?; rm -rf $$d; exit $$rc

.PHONY: image
image: ## the container image, without a container runtime: a static, nonroot, shell-less infergate for linux/amd64 and linux/arm64 as an OCI layout in bin/image (tag: the chart's appVersion); then its test
	cd deploy/image && $(GO) run . -out ../../bin/image
	cd deploy/image && $(GO) test -count=1 ./...

.PHONY: bench
bench: ## decision latency over loopback gRPC (table for BENCHMARKS.md) and Go micro-benchmarks
	$(GO) run ./test/extprocbench -runs 5
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./...

.PHONY: bench-bodies
bench-bodies: ## hostile 4 MiB bodies against infergate serve on one CPU: peak RSS and ordinary requests' decision latency (≈ 2 min; table for RELIABILITY.md)
	$(GO) run ./test/bodybench -runs 3

.PHONY: bench-admission
bench-admission: ## goodput under 3× overload: admission queue against no queue and a plain FIFO, and with the gateways starved of CPU, and an A/A run of its recovery rule (≈ 25 min; table for BENCHMARKS.md)
	$(GO) run ./test/admissionbench -runs 3

.PHONY: bench-fleet
bench-fleet: ## placement on a heterogeneous fleet: goodput and $ per 1M output tokens, four policies and SLO placement with the admission queue instead of a managed API (≈ 22 min; table for BENCHMARKS.md)
	$(GO) run ./test/fleetbench -runs 3

.PHONY: bench-placement
bench-placement: ## placement over a generated family of fleets and workloads (24 scenarios × 3 arrival seeds, five policies; ≈ 2 min in simulated time; table for BENCHMARKS.md; -quick: CI-sized)
	$(GO) run ./test/placementbench

.PHONY: bench-pd
bench-pd: ## prefill/decode disaggregation: aggregated, split at a fixed ratio and the per-request choice, over a sweep of chat rates with long-prompt bursts, under SLO and affinity placement, on the base fleet and a family of 12 others, with an A/A row for chance (simulated time, ≈ 15 min; tables for BENCHMARKS.md)
	$(GO) run ./test/placementbench -pd -seeds 5 -pd-family 12

.PHONY: bench-rollout
bench-rollout: ## rollout gates' error rates: 200 A/A rollouts and 100 of each fault through rollout.Controller on the simulated fleet, in simulated time, and 200 A/A with fixed pools (≈ 5 min; table for BENCHMARKS.md)
	$(GO) run ./test/rolloutbench

.PHONY: bench-routing
bench-routing: ## routing policies compared on the simulated fleet (table for BENCHMARKS.md)
	$(GO) run ./test/routingbench

.PHONY: bench-scale
bench-scale: ## affinity across 1-16 gateway replicas, alone and sharing placements, on 16 simulated engines (issue #19; ≈ 20 min; table for BENCHMARKS.md)
	$(GO) run ./test/routingbench -replicas 16 -gateways 1,2,4,8,16 -only "shared prefix," -runs 3 -timescale 0.1

.PHONY: bench-fleetstate
bench-fleetstate: ## what keeping the fleet's state costs: 20 gateway replicas × 200 engines, scraping alone and through the relay (issue #19; ≈ 5 min; needs redis-server)
	$(GO) run ./test/scrapebench -engines 200 -gateways 20 -window 5s -runs 3
	$(GO) run ./test/scrapebench -engines 50 -gateways 4 -window 5s -runs 3

.PHONY: chaos
chaos: test-deps ## reliability suite: faults injected one at a time under load, table for RELIABILITY.md (≤ 10 min)
	$(GO) run ./test/chaos

.PHONY: chaos-regions
chaos-regions: test-deps ## regions over a real network (root: network namespaces, Toxiproxy between them): every fault, table for RELIABILITY.md (≈ 2 min)
	$(GO) run ./test/regionchaos

.PHONY: stress-quota
stress-quota: test-deps ## the quota outage tests 20 times under the race detector beside two CPU hogs (issue #35's lost refund; ≈ 2 min)
	@bash -c 'hog() { while :; do :; done; }; hog & h1=$$!; hog & h2=$$!; trap "kill $$h1 $$h2" EXIT; \
	  $(GO) test -race -count=20 -run "TestSettlementsHeldThroughOutage|TestLostAdmissionReply" ./quota'

.PHONY: fuzz
fuzz: ## run every fuzz target for FUZZTIME each (default 20s)
	@set -e; for pkg in $$($(GO) list ./...); do \
	  dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
	  for fz in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/func //'); do \
	    echo "== $$pkg $$fz"; \
	    $(GO) test $$pkg -run '^$$' -fuzz "^$$fz$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) $(FUZZFLAGS); \
	  done; \
	done

.PHONY: lint
lint: ## gofmt, go vet and staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd deploy/envoy/minversion && $(GO) vet ./...
	cd deploy/helm && $(GO) vet ./...
	cd deploy/image && $(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

.PHONY: demo
demo: build ## simulated fleet + infergate + data plane on :8080 + traffic, live table (DEMO_DURATION=30s stops); installs nothing
	$(GO) build -o bin/demo ./test/demo
	./$(BIN) validate examples/quickstart/policy.yaml
	./bin/demo --infergate $(BIN)

.PHONY: clean
clean: ## remove build output
	rm -rf bin
