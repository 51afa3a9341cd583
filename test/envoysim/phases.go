package envoysim

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

var regexCache sync.Map // string -> *regexp.Regexp

func compiledRegex(re string) *regexp.Regexp {
	if v, ok := regexCache.Load(re); ok {
		return v.(*regexp.Regexp)
	}
	c, err := regexp.Compile("^(?:" + re + ")$")
	if err != nil {
		c = regexp.MustCompile(`^\b$`) // matches nothing
	}
	regexCache.Store(re, c)
	return c
}

// readChunk reads what the client or upstream has sent, up to one frame. eof is set when the body ended with
// this read (net/http returns the last data together with io.EOF when the length is known).
func readChunk(r io.Reader) ([]byte, bool, error) {
	buf := make([]byte, chunkReadBuffer)
	for {
		n, err := r.Read(buf)
		switch {
		case errors.Is(err, io.EOF):
			return buf[:n], true, nil
		case err != nil:
			return nil, false, err
		case n > 0:
			return buf[:n], false, nil
		}
	}
}

// message is what flows through a body pipeline: a chunk and whether it ends the body.
type message struct {
	data []byte
	end  bool
}

// applyHeadersResponse applies a headers answer (either direction). It returns a replacement body when the
// status is CONTINUE_AND_REPLACE (then no more body or trailer messages go to the processor).
func (f *filter) applyHeadersResponse(h *headerMap, cr *extprocv3.CommonResponse, request bool, dropCL bool) (replace []byte, replaced bool, err error) {
	isReplace := cr.GetStatus() == extprocv3.CommonResponse_CONTINUE_AND_REPLACE
	if err := f.chk.applyMutation(h, cr.GetHeaderMutation(), dropCL, isReplace); err != nil {
		return nil, false, f.processingError(err)
	}
	if request && f.clearsRoute(cr) {
		f.routeCleared = true
	}
	if isReplace {
		h.del("content-length")
		return mutatedBody(cr.GetBodyMutation(), nil), true, nil
	}
	return nil, false, nil
}

// processingError is any other processing failure: status_on_error.
func (f *filter) processingError(err error) error {
	f.complete = true
	f.cancel()
	return &localReply{status: f.statusOnError(), body: []byte("ext_proc error: " + err.Error()), details: "ext_proc_error_processing"}
}

// requestPath runs the request through the processor. It returns the headers and body to send upstream.
// body is the client's body (nil when the request has none); trailers are read after it.
func (f *filter) requestPath(h *headerMap, body io.Reader, trailers *headerMap) (io.Reader, error) {
	bm := f.mode.GetRequestBodyMode()
	if body == nil {
		bm = modeNone
	}
	sendHeaders := f.sendsRequestHeaders()
	dropCL := f.removesContentLength(bm, sendHeaders)
	concurrent := bm == modeFullDuplex || (bm == modeStreamed && f.cfg.GetSendBodyWithoutWaitingForHeaderResponse())
	if sendHeaders {
		if err := f.send(headersMsg(true, h, f.fwd, body == nil)); err != nil {
			return f.bypassed(err, body)
		}
		if !concurrent {
			resp, err := f.awaitResp(f.messageTimeout(), isRequestHeaders)
			if err != nil {
				return f.bypassed(err, body)
			}
			repl, replaced, err := f.applyHeadersResponse(h, headersCommon(resp), true, dropCL)
			if err != nil {
				return nil, err
			}
			if replaced {
				if body != nil {
					go func() { _, _ = io.Copy(io.Discard, body) }() // the client's body is drained
				}
				return bytes.NewReader(repl), nil
			}
		}
	}
	if dropCL {
		h.del("content-length")
	}
	switch bm {
	case modeNone:
		return body, nil
	case modeBuffered, modePartial:
		return f.requestBuffered(h, body, trailers, bm)
	default:
		return f.requestStreaming(h, body, trailers, bm, sendHeaders && concurrent, dropCL)
	}
}

// bypassed continues unprocessed after the processor dropped out, or returns the local reply.
func (f *filter) bypassed(err error, body io.Reader) (io.Reader, error) {
	if errors.Is(err, errBypass) {
		return body, nil
	}
	return nil, err
}

// requestBuffered implements BUFFERED (413 over the limit) and BUFFERED_PARTIAL (one round trip, then the
// rest passes through).
func (f *filter) requestBuffered(h *headerMap, body io.Reader, trailers *headerMap, bm bodyMode) (io.Reader, error) {
	limit := f.dp.cfg.BufferLimit
	data, err := io.ReadAll(io.LimitReader(body, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	var rest io.Reader
	end := true
	if len(data) > limit {
		if bm == modeBuffered {
			f.complete = true
			return nil, &localReply{status: http.StatusRequestEntityTooLarge, body: []byte("Payload Too Large"), details: "request_payload_too_large"}
		}
		rest = io.MultiReader(bytes.NewReader(data[limit:]), body)
		data, end = data[:limit], false
	}
	hasTrailers := end && trailers != nil && len(trailers.kv) > 0 && f.sendsRequestTrailers()
	if err := f.send(bodyMsg(true, data, end && !hasTrailers)); err != nil {
		return f.bypassed(err, joinBody(data, rest))
	}
	resp, err := f.awaitResp(f.messageTimeout(), isRequestBody)
	if err != nil {
		return f.bypassed(err, joinBody(data, rest))
	}
	cr := bodyCommon(resp)
	// Header mutations in a body answer apply in BUFFERED and BUFFERED_PARTIAL (headers are still held).
	if err := f.chk.applyMutation(h, cr.GetHeaderMutation(), f.removesContentLength(bm, f.sendsRequestHeaders()), false); err != nil {
		return nil, f.processingError(err)
	}
	if f.clearsRoute(cr) {
		f.routeCleared = true
	}
	if sr := cr.GetBodyMutation().GetStreamedResponse(); sr != nil {
		return nil, f.spurious("streamed_response outside FULL_DUPLEX_STREAMED")
	}
	out := mutatedBody(cr.GetBodyMutation(), data)
	if cl, ok := h.get("content-length"); ok && cr.GetBodyMutation() != nil {
		if n, err := strconv.Atoi(cl); err != nil || n != len(out) {
			return nil, f.processingError(errors.New("mismatch between content length and the length of the mutated body"))
		}
	}
	if hasTrailers {
		if err := f.send(trailersMsg(true, trailers)); err == nil {
			tr, err := f.awaitResp(f.messageTimeout(), isRequestTrailers)
			if err != nil && !errors.Is(err, errBypass) {
				return nil, err
			}
			if tr != nil {
				if err := f.chk.applyMutation(trailers, tr.GetRequestTrailers().GetHeaderMutation(), false, false); err != nil {
					return nil, f.processingError(err)
				}
			}
		}
	}
	return joinBody(out, rest), nil
}

func joinBody(data []byte, rest io.Reader) io.Reader {
	if rest == nil {
		return bytes.NewReader(data)
	}
	return io.MultiReader(bytes.NewReader(data), rest)
}

// requestStreaming implements STREAMED (pipelined chunks, one answer per chunk in order) and
// FULL_DUPLEX_STREAMED (decoupled streamed_response chunks). It returns once the headers answer is in; the
// body keeps flowing through a pipe, and f.requestDone is closed when it has all gone through.
func (f *filter) requestStreaming(h *headerMap, body io.Reader, trailers *headerMap, bm bodyMode, headersPending, dropCL bool) (io.Reader, error) {
	if err := f.open(); err != nil {
		return f.bypassed(f.grpcFailure(err), body)
	}
	pr, pw := io.Pipe()
	sd := f.startSender(true, body, trailers, bm)
	queue, bypass, sendErr, trailersSent := sd.queue, &sd.bypass, sd.err, sd.trailersSent

	if headersPending {
		// FULL_DUPLEX_STREAMED (or STREAMED sending without waiting): the headers answer may come after
		// body chunks; Envoy holds the request until it arrives.
		timeout := f.messageTimeout()
		if bm == modeFullDuplex {
			timeout = 0
		}
		resp, err := f.awaitWatchingBody(timeout, isRequestHeaders, sendErr)
		if err != nil {
			if errors.Is(err, errBypass) && bm == modeStreamed {
				bypass.Store(true)
				go f.forwardUnprocessed(queue, pw)
				f.requestDone = closedChan()
				return pr, nil
			}
			pw.CloseWithError(err)
			return nil, err
		}
		repl, replaced, err := f.applyHeadersResponse(h, headersCommon(resp), true, dropCL)
		if err != nil {
			return nil, err
		}
		if replaced {
			bypass.Store(true)
			go func() {
				for range queue { // drain the client's body
				}
			}()
			f.requestDone = closedChan()
			return bytes.NewReader(repl), nil
		}
	}
	done := make(chan struct{})
	f.requestDone = done
	go func() {
		defer close(done)
		var err error
		if bm == modeFullDuplex {
			err = f.pumpDuplex(true, pw, trailersSent, nil)
		} else {
			err = f.pumpStreamed(true, queue, pw, bypass, trailersSent, nil)
		}
		select {
		case e := <-sendErr:
			if err == nil {
				err = e
			}
		default:
		}
		if err != nil {
			f.requestErr = err
			pw.CloseWithError(err)
			return
		}
		pw.Close()
	}()
	return pr, nil
}

// awaitWatchingBody waits for a processor answer while the client's body is still arriving: when reading the
// body fails (request_timeout, a reset), Envoy ends the request and the filter's stream instead of waiting for
// an answer the processor may hold until the body is complete. The body's error is returned in that case.
func (f *filter) awaitWatchingBody(timeout time.Duration, want func(*extprocv3.ProcessingResponse) bool, bodyErr chan error) (*extprocv3.ProcessingResponse, error) {
	done := make(chan struct{})
	failed := make(chan error, 1)
	go func() {
		select {
		case err := <-bodyErr:
			failed <- err
			f.cancel()
		case <-done:
		}
	}()
	resp, err := f.awaitResp(timeout, want)
	close(done)
	select {
	case berr := <-failed:
		return nil, berr
	default:
	}
	return resp, err
}

// sender streams a body to the processor frame by frame, from its own goroutine.
type sender struct {
	queue        chan message // STREAMED: sent chunks awaiting their answer, FIFO; after a bypass, unsent chunks
	bypass       atomic.Bool
	err          chan error
	trailersSent chan bool // receives true if trailers were sent; closed at the end of the body
}

// startSender sends body frames as they arrive (STREAMED and FULL_DUPLEX_STREAMED), with the last data frame
// carrying end_of_stream unless trailers follow, and then the trailers if the trailer mode is SEND.
func (f *filter) startSender(request bool, body io.Reader, trailers *headerMap, bm bodyMode) *sender {
	sd := &sender{queue: make(chan message, 4096), err: make(chan error, 1), trailersSent: make(chan bool, 1)}
	attachConfig := !f.sentAny
	f.sentAny = true
	md := f.metadataContext()
	protocol := &extprocv3.ProtocolConfiguration{
		RequestBodyMode: f.mode.GetRequestBodyMode(), ResponseBodyMode: f.mode.GetResponseBodyMode(),
		SendBodyWithoutWaitingForHeaderResponse: f.cfg.GetSendBodyWithoutWaitingForHeaderResponse(),
	}
	sendTrailers := f.sendsRequestTrailers()
	if !request {
		sendTrailers = f.sendsResponseTrailers()
	}
	go func() {
		defer close(sd.queue)
		defer close(sd.trailersSent)
		for {
			chunk, eof, err := readChunk(body)
			if err != nil {
				sd.err <- err
				return
			}
			// Trailers are known once the body has been read to its end.
			hasTrailers := eof && sendTrailers && trailers != nil && len(trailers.kv) > 0
			if sd.bypass.Load() {
				sd.queue <- message{chunk, eof}
			} else if !(hasTrailers && len(chunk) == 0) {
				if bm == modeFullDuplex {
					f.bodySeen.Store(true)
				}
				m := bodyMsg(request, chunk, eof && !hasTrailers)
				if attachConfig {
					m.ProtocolConfig, attachConfig = protocol, false
				}
				m.MetadataContext = md
				if request {
					f.attachRequestAttributes(m)
				}
				if err := f.sendLocked(m); err != nil && !errors.Is(err, io.EOF) {
					sd.err <- err
					return
				}
				if bm == modeStreamed {
					sd.queue <- message{chunk, eof}
				}
			}
			if eof {
				if hasTrailers && !sd.bypass.Load() {
					m := trailersMsg(request, trailers)
					m.MetadataContext = md
					if f.sendLocked(m) == nil {
						sd.trailersSent <- true
					}
				}
				return
			}
		}
	}()
	return sd
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// forwardUnprocessed passes queued and later chunks through unchanged after a bypass.
func (f *filter) forwardUnprocessed(queue <-chan message, w *io.PipeWriter) {
	for m := range queue {
		if _, err := w.Write(m.data); err != nil {
			return
		}
	}
	w.Close()
}

// pumpStreamed applies STREAMED answers: each BodyResponse belongs to the oldest chunk not yet answered.
// Header mutations in these answers are ignored (headers already went on).
func (f *filter) pumpStreamed(request bool, queue <-chan message, w io.Writer, bypass *atomic.Bool, trailersSent <-chan bool, trailers *headerMap) error {
	want := isRequestBody
	if !request {
		want = isResponseBody
	}
	for m := range queue {
		if bypass.Load() {
			if _, err := w.Write(m.data); err != nil {
				return err
			}
			continue
		}
		resp, err := f.awaitResp(f.messageTimeout(), want)
		if err != nil {
			if errors.Is(err, errBypass) {
				bypass.Store(true)
				if _, err := w.Write(m.data); err != nil {
					return err
				}
				continue
			}
			return err
		}
		cr := bodyCommon(resp)
		if cr.GetBodyMutation().GetStreamedResponse() != nil {
			return f.spurious("streamed_response outside FULL_DUPLEX_STREAMED")
		}
		out := mutatedBody(cr.GetBodyMutation(), m.data)
		if _, err := w.Write(out); err != nil {
			return err
		}
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
	}
	return f.awaitTrailers(request, trailersSent, trailers)
}

// pumpDuplex applies FULL_DUPLEX_STREAMED answers: any number of streamed_response chunks, the last with
// end_of_stream; a trailers answer may arrive while still in the body state.
func (f *filter) pumpDuplex(request bool, w io.Writer, trailersSent <-chan bool, trailers *headerMap) error {
	want := isRequestBody
	if !request {
		want = isResponseBody
	}
	trailersAnswered := false
	for {
		resp, err := f.awaitResp(0, func(r *extprocv3.ProcessingResponse) bool {
			return want(r) || (request && isRequestTrailers(r)) || (!request && isResponseTrailers(r))
		})
		if err != nil {
			return err
		}
		if want(resp) {
			sr := bodyCommon(resp).GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return f.spurious("non-streamed body mutation in FULL_DUPLEX_STREAMED")
			}
			if _, err := w.Write(sr.GetBody()); err != nil {
				return err
			}
			if fl, ok := w.(http.Flusher); ok {
				fl.Flush()
			}
			if sr.GetEndOfStream() {
				break
			}
			continue
		}
		trailersAnswered = true
		f.applyTrailersAnswer(request, resp, trailers)
	}
	if trailersAnswered {
		return nil
	}
	return f.awaitTrailers(request, trailersSent, trailers)
}

// awaitTrailers waits for the trailers answer when trailers were sent.
func (f *filter) awaitTrailers(request bool, trailersSent <-chan bool, trailers *headerMap) error {
	if trailersSent == nil {
		return nil
	}
	if sent := <-trailersSent; !sent {
		return nil
	}
	want := isRequestTrailers
	if !request {
		want = isResponseTrailers
	}
	resp, err := f.awaitResp(f.messageTimeout(), want)
	if err != nil {
		if errors.Is(err, errBypass) {
			return nil
		}
		return err
	}
	f.applyTrailersAnswer(request, resp, trailers)
	return nil
}

func (f *filter) applyTrailersAnswer(request bool, resp *extprocv3.ProcessingResponse, trailers *headerMap) {
	if trailers == nil {
		return
	}
	hm := resp.GetRequestTrailers().GetHeaderMutation()
	if !request {
		hm = resp.GetResponseTrailers().GetHeaderMutation()
	}
	_ = f.chk.applyMutation(trailers, hm, false, false)
}
