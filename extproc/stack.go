package extproc

// A stream's goroutine is new (gRPC starts one per stream) and its stack small; a decision reaches 18-20 KiB
// below the gRPC handler, down to prefix hashing and SLO placement (measured 2026-12-06). Growing there takes
// several doublings, each copying the stack and adjusting every frame on it: about 13 µs of a 2 KiB decision
// (BenchmarkProcessOnANewGoroutine; BENCHMARKS.md, "Where a decision's CPU goes"). decide calls growStack first,
// which takes the room in one step while the stack holds a few frames. The memory is what the decision would
// have grown to; a stream refused before its decision never takes it, and the garbage collector shrinks the
// stack again while the stream waits on the response.

// decisionStackBytes is the frame growStack asks for: with the frames above it, the stack becomes 32 KiB.
const decisionStackBytes = 16 << 10

// growStack grows the calling goroutine's stack to hold a decision.
//
//go:noinline
func growStack() {
	var frame [decisionStackBytes]byte
	keepFrame(frame[:])
}

// keepFrame keeps growStack's frame from being optimised away.
//
//go:noinline
func keepFrame([]byte) {}
