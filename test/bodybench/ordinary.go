package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The ordinary clients may run in a process of their own, with a gRPC connection of their own (-ordinary-process):
// Envoy's workers send an ordinary request as soon as it arrives, whatever the hostile streams beside it; one
// Go process sending 64 hostile streams from one CPU delays its own ordinary sends behind them, and a latency
// measured there is partly the bench client's.

// ordinaryChild is the child's main: the ordinary load against addr for d, reported as JSON on stdout.
func ordinaryChild(b *bench, addr string, d time.Duration) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	var errs, total atomic.Int64
	lat := b.ordinaryLoad(context.Background(), extprocv3.NewExternalProcessorClient(conn), d, &errs, &total)
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"latencies": lat, "errors": errs.Load(), "total": total.Load()})
}

// ordinaryInChild runs the ordinary load for d in a child process of this binary, on the clients' CPUs.
func (b *bench) ordinaryInChild(addr string, d time.Duration, errs, total *atomic.Int64) ([]time.Duration, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"-ordinary-child", addr, "-ordinary-for", d.String(), "-modes", b.mode.String(), "-chunk", strconv.Itoa(b.chunk)}
	if b.clientCPUs != "" {
		args = append([]string{"-c", b.clientCPUs, exe}, args...)
		exe = "taskset"
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("ordinary clients' process: %w", err)
	}
	var rep struct {
		Latencies     []time.Duration `json:"latencies"`
		Errors, Total int64
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		return nil, fmt.Errorf("ordinary clients' report: %w", err)
	}
	errs.Add(rep.Errors)
	total.Add(rep.Total)
	return rep.Latencies, nil
}
