package extproc

// A stream's goroutine is new (gRPC starts one per stream) and its stack small; a decision reaches 18-20 KiB
// below the gRPC handler, down to prefix hashing and SLO placement (measured 2026-12-06). Growing there takes
// several doublings, each copying the stack and adjusting every frame on it. decide calls growStack first,
// which takes the room in one step while the stack holds a few frames: BenchmarkProcessOnANewGoroutine, 2 KiB,
// 35 µs without it and 21 µs with it (BENCHMARKS.md, "Where a decision's CPU goes"; 32 KiB 70 and 57 µs). The
// price is zeroing the frame, about 0.3 µs, also when the stack is grown already. The memory is what the
// decision would have grown to; a stream refused before its decision never takes it. The garbage collector may
// shrink the stack while the stream waits on the response, and settlement then grows it again, as before.

// decisionStackBytes is the frame growStack asks for. The runtime grows a stack to the power of two that holds
// what is in use plus the frame: 32 KiB here, which a decision's 18-20 KiB fits with room.
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
