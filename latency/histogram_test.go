package latency

import (
	"testing"
	"time"
)

func TestQuantileWithinABucket(t *testing.T) {
	var h Histogram
	if h.Quantile(0.95) != 0 {
		t.Fatal("an empty histogram has a quantile")
	}
	for i := range 100 {
		h.Add(time.Duration(100+i) * time.Millisecond) // 100..199 ms: the p95 sample is 194 ms
	}
	if p := h.Quantile(0.95); p < 194*time.Millisecond || p > 214*time.Millisecond {
		t.Errorf("p95 %v, want 194 ms within a bucket's 10 %%", p)
	}
	var o Histogram
	o.Add(time.Hour) // beyond the last bucket: counted in it
	o.Add(0)
	h.Merge(&o)
	if p := h.Quantile(1); p < 900*time.Second {
		t.Errorf("max %v", p)
	}
	if p := h.Quantile(0); p != time.Millisecond {
		t.Errorf("min %v", p)
	}
}
