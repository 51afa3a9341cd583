package regionnet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Answer is what one request got: its status, and who served it — a region, "managed" (outside every region)
// or "managed-<region>" — read from the simulated replica that answered (fleetsim's x-simulated-replica).
type Answer struct {
	Status int
	Served string
	// Code is the OpenAI error code of a refusal.
	Code string
	Err  error
	// Took is the time from sending to the whole answer.
	Took time.Duration
	// Window is, for an answer admitted under a requestsPerSecond limit, the end (a Unix second) of the
	// one-second window the quota counted it in. The gateway computed x-ratelimit-reset-requests from the moment
	// its admission began (which also picks the window: an admission that waited out a Redis timeout is counted
	// in the window it began in), some time after the request was sent; so the window's end is the first whole
	// second at or after the sending plus the reset (less the header's millisecond rounding), as long as the
	// admission began within a second of the sending. 0 otherwise.
	Window int64
}

// Lost says the request got no answer, or one no client could act on: not a 2xx, and not an OpenAI-shaped
// refusal (429, 503 with an error code).
func (a Answer) Lost() bool {
	return a.Err != nil || (a.Status/100 != 2 && a.Code == "")
}

var client = &http.Client{Timeout: 20 * time.Second}

// Ask sends one small chat request as tenant to region's data plane.
func (c *Cluster) Ask(ctx context.Context, region, tenant, prompt string) Answer {
	body := fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":%q}]}`, prompt)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.EdgeURL(region)+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return Answer{Err: err}
	}
	req.Header.Set("Authorization", "Bearer "+Key(tenant))
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return Answer{Err: err, Took: time.Since(start)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	a := Answer{Status: resp.StatusCode, Err: err, Took: time.Since(start)}
	var doc struct {
		Error *struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &doc) == nil && doc.Error != nil {
		a.Code = doc.Error.Code
	}
	a.Served = c.servedBy(resp.Header.Get("x-simulated-replica"))
	if reset, err := time.ParseDuration(resp.Header.Get("x-ratelimit-reset-requests")); err == nil && a.Status/100 == 2 {
		a.Window = windowEnd(start.Add(reset - time.Millisecond))
	}
	if a.Status/100 == 2 && a.Served == "" {
		a.Err = fmt.Errorf("a %d answer names no replica: %.200s", a.Status, data)
	}
	return a
}

// servedBy maps the simulated replica that answered to who served: its region ("<region>-<k>"), "managed"
// (outside every region) or "managed-<region>" (the managed API kept inside one).
func (c *Cluster) servedBy(replica string) string {
	switch {
	case replica == "managed":
		return "managed"
	case replica == "inside":
		return "managed-" + c.opts.Inside
	}
	if i := strings.LastIndexByte(replica, '-'); i > 0 {
		return replica[:i]
	}
	return ""
}

// windowEnd is the first whole Unix second at or after t.
func windowEnd(t time.Time) int64 {
	end := t.Unix()
	if time.Unix(end, 0).Before(t) {
		end++
	}
	return end
}
