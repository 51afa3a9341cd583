package extproc

import (
	"io"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/netturn"
	"github.com/infergate/infergate/openai"
)

// responseTiming is what the response path measures of one request: when it was routed, when chunks carrying
// generated content passed, and the longest gap between them.
type responseTiming struct {
	routed, first, last time.Time
	maxGap              time.Duration
}

// content notes a response chunk that carried generated content, passing at now.
func (t *responseTiming) content(now time.Time) {
	if t.first.IsZero() {
		t.first = now
	} else if gap := now.Sub(t.last); gap > t.maxGap {
		t.maxGap = gap
	}
	t.last = now
}

// noteContent notes a response chunk that carried generated content, passing now; the first tells the
// director the request's prompt is prefilled (Director.FirstToken).
func (rs *requestState) noteContent() {
	first := rs.timing.first.IsZero()
	rs.timing.content(rs.now())
	if first && rs.route != nil {
		rs.srv.director.FirstToken(rs.route)
	}
}

// chunked reports whether the response body mode lets the gateway see chunks as they arrive. In BUFFERED
// modes Envoy sends the whole body at once, so the first content is the end of the response; with NONE only
// the headers are seen.
func chunked(mode bodyMode) bool {
	return mode == filterv3.ProcessingMode_STREAMED || mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

// startOutputDigest prepares the digest of the generated text, when settlements carry digests.
func (rs *requestState) startOutputDigest() {
	if rs.srv.opts.DigestKey != nil && rs.output == nil {
		rs.output = rs.srv.opts.DigestKey.Digester()
		if rs.sse != nil {
			rs.sse.Text = rs.output
		}
	}
}

// byteCounter is an io.Writer that counts what it is given.
type byteCounter int64

func (n *byteCounter) Write(p []byte) (int, error) { *n += byteCounter(len(p)); return len(p), nil }

// outcome gathers what the response path saw for the director.
func (rs *requestState) outcome(aborted bool) director.Outcome {
	ended := rs.endedAt
	if ended.IsZero() {
		ended = rs.now()
	}
	o := director.Outcome{Status: rs.upstreamStatus, Aborted: aborted, Served: rs.served, Ended: ended,
		FirstContent: rs.timing.first, LastContent: rs.timing.last, MaxGap: rs.timing.maxGap,
		Chunked: chunked(rs.respMode) && !rs.timing.first.IsZero()}
	// The body passed the gateway whole enough to count its output: its mode is not NONE (where the event
	// scanner is set up but sees nothing), and a JSON body fit what is held.
	o.BodySeen = rs.respMode != filterv3.ProcessingMode_NONE && !rs.respTooBig
	switch {
	case rs.sse != nil:
		o.Usage, o.Reported = rs.sse.Usage()
		o.ContentEvents = rs.sse.ContentEvents()
		o.FinishReason = rs.sse.FinishReason()
	case rs.respBody != nil:
		o.Usage, o.Reported, o.FinishReason = openai.AnswerFromJSON(rs.respBody)
		if rs.route.PairsAnswer() && rs.answer == nil {
			rs.answer = &boundedText{max: director.MaxPairedAnswer}
			openai.OutputText(rs.respBody, rs.answer)
		}
		if !o.Reported {
			var n byteCounter
			openai.OutputText(rs.respBody, &n)
			o.OutputTextBytes = int64(n)
		}
	}
	if rs.answer != nil {
		o.AnswerText = rs.answer.b
	}
	if rs.srv.opts.DigestKey != nil {
		rs.digests(&o)
	}
	return o
}

// startAnswerCapture keeps a stream's generated text when its request's shadow copy is judged against it.
func (rs *requestState) startAnswerCapture() {
	if !rs.route.PairsAnswer() || rs.sse == nil || rs.answer != nil {
		return
	}
	rs.answer = &boundedText{max: director.MaxPairedAnswer}
	if rs.sse.Text != nil {
		rs.sse.Text = io.MultiWriter(rs.sse.Text, rs.answer)
	} else {
		rs.sse.Text = rs.answer
	}
}

// boundedText keeps the first max bytes written to it and drops the rest.
type boundedText struct {
	b   []byte
	max int
}

func (t *boundedText) Write(p []byte) (int, error) {
	if room := t.max - len(t.b); room > 0 {
		t.b = append(t.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

// digestPrompt takes the digest of the prompt field's bytes as the client sent them, while the request still
// holds its body.
func (rs *requestState) digestPrompt(prompt []byte) {
	if k := rs.srv.opts.DigestKey; k != nil && len(prompt) > 0 {
		// A large prompt's digest gives way (netturn); one of 64 KiB or less never yields.
		rs.promptDigest = k.DigestYielding(prompt, netturn.Yield)
	}
}

// digests hands the settlement the prompt's digest and takes the generated text's.
func (rs *requestState) digests(o *director.Outcome) {
	o.PromptDigest, o.DigestKey = rs.promptDigest, rs.srv.opts.DigestKey.ID
	if rs.output == nil && rs.respBody != nil && rs.endpoint != openai.EndpointEmbeddings {
		rs.output = rs.srv.opts.DigestKey.Digester()
		openai.OutputText(rs.respBody, rs.output)
	}
	if rs.output == nil {
		return
	}
	if o.Status < 400 && o.Status != 0 {
		o.OutputDigest = rs.output.Hex()
	}
	// Settled: nothing more is written to it. The event scanner lets go of it first.
	if rs.sse != nil {
		rs.sse.Text = nil
	}
	rs.output.Release()
	rs.output = nil
}
