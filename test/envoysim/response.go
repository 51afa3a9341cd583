package envoysim

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// downstream is where the response goes: the client's connection.
type downstream struct {
	w           http.ResponseWriter
	headersSent bool
}

func (d *downstream) writeHeaders(h *headerMap) {
	status := http.StatusOK
	for _, e := range h.kv {
		switch {
		case e.k == ":status":
			if n, err := strconv.Atoi(e.v); err == nil {
				status = n
			}
		case e.k[0] == ':':
		default:
			d.w.Header().Add(e.k, e.v)
		}
	}
	d.w.WriteHeader(status)
	d.headersSent = true
}

func (d *downstream) Write(p []byte) (int, error) { return d.w.Write(p) }

func (d *downstream) Flush() {
	if fl, ok := d.w.(http.Flusher); ok {
		fl.Flush()
	}
}

// responsePath runs the upstream response through the processor to the client. body is nil when the
// response has none. An error returned before the headers went downstream becomes a local reply; after
// that, the caller resets the stream.
func (f *filter) responsePath(h *headerMap, body io.Reader, trailers *headerMap, d *downstream) error {
	if f.requestDone != nil {
		<-f.requestDone // the request body is through the processor before the response path starts
		if f.requestErr != nil {
			return f.requestErr
		}
	}
	bm := f.mode.GetResponseBodyMode()
	if body == nil {
		bm = modeNone
	}
	sendHeaders := f.sendsResponseHeaders() && !f.complete
	dropCL := f.removesContentLength(bm, sendHeaders)
	concurrent := bm == modeFullDuplex
	if sendHeaders {
		err := f.send(headersMsg(false, h, f.fwd, body == nil))
		if err == nil && !concurrent {
			var resp *extprocv3.ProcessingResponse
			resp, err = f.awaitResp(f.messageTimeout(), isResponseHeaders)
			if err == nil {
				var repl []byte
				var replaced bool
				repl, replaced, err = f.applyHeadersResponse(h, headersCommon(resp), false, dropCL)
				if err == nil && replaced {
					d.writeHeaders(h)
					_, err = d.Write(repl)
					return err
				}
			}
		}
		if err != nil && !errors.Is(err, errBypass) {
			return err
		}
		if errors.Is(err, errBypass) {
			bm, concurrent = modeNone, false
		}
	} else if f.complete {
		bm = modeNone
	}
	if dropCL && bm != modeNone {
		h.del("content-length")
	}
	switch bm {
	case modeNone:
		d.writeHeaders(h)
		if body != nil {
			return copyFlush(d, body)
		}
		return nil
	case modeBuffered, modePartial:
		return f.responseBuffered(h, body, trailers, bm, d)
	}
	sd := f.startSender(false, body, trailers, bm)
	if concurrent {
		if sendHeaders {
			resp, err := f.awaitResp(0, isResponseHeaders)
			if err != nil {
				return err
			}
			repl, replaced, err := f.applyHeadersResponse(h, headersCommon(resp), false, dropCL)
			if err != nil {
				return err
			}
			if replaced {
				d.writeHeaders(h)
				_, err = d.Write(repl)
				return err
			}
		}
		d.writeHeaders(h)
		return f.pumpDuplexWatching(sd, flushWriter{d}, trailers)
	}
	d.writeHeaders(h)
	err := f.pumpStreamed(false, sd.queue, flushWriter{d}, &sd.bypass, sd.trailersSent, trailers)
	if err == nil {
		select {
		case err = <-sd.err:
		default:
		}
	}
	return err
}

// pumpDuplexWatching relays the processor's streamed response body while watching the upstream body: when
// the upstream stream breaks, Envoy resets the downstream stream and destroys the filter, which closes the
// ext_proc stream; it never waits for an end of stream that cannot come.
func (f *filter) pumpDuplexWatching(sd *sender, w io.Writer, trailers *headerMap) error {
	done := make(chan struct{})
	upstream := make(chan error, 1)
	go func() {
		select {
		case err := <-sd.err:
			upstream <- err
			f.cancel()
		case <-done:
		}
	}()
	err := f.pumpDuplex(false, w, sd.trailersSent, trailers)
	close(done)
	select {
	case uerr := <-upstream:
		return &upstreamReset{uerr}
	default:
	}
	return err
}

// upstreamReset is an upstream response body that broke after its headers went downstream.
type upstreamReset struct{ err error }

func (e *upstreamReset) Error() string { return "upstream reset: " + e.err.Error() }

type flushWriter struct{ d *downstream }

func (w flushWriter) Write(p []byte) (int, error) {
	n, err := w.d.Write(p)
	w.d.Flush()
	return n, err
}

// responseBuffered: the whole body in one message (500 over the limit: the headers are still held), or, for
// BUFFERED_PARTIAL, the first buffer-full in one round trip and the rest passed through.
func (f *filter) responseBuffered(h *headerMap, body io.Reader, trailers *headerMap, bm bodyMode, d *downstream) error {
	limit := f.dp.cfg.BufferLimit
	data, err := io.ReadAll(io.LimitReader(body, int64(limit)+1))
	if err != nil {
		return err
	}
	var rest io.Reader
	end := true
	if len(data) > limit {
		if bm == modeBuffered {
			f.complete = true
			return &localReply{status: http.StatusInternalServerError, body: []byte("response payload too large"), details: "response_payload_too_large"}
		}
		rest = io.MultiReader(bytes.NewReader(data[limit:]), body)
		data, end = data[:limit], false
	}
	hasTrailers := end && trailers != nil && len(trailers.kv) > 0 && f.sendsResponseTrailers()
	out := data
	if err := f.send(bodyMsg(false, data, end && !hasTrailers)); err == nil {
		resp, err := f.awaitResp(f.messageTimeout(), isResponseBody)
		switch {
		case errors.Is(err, errBypass):
		case err != nil:
			return err
		default:
			cr := bodyCommon(resp)
			if err := f.chk.applyMutation(h, cr.GetHeaderMutation(), f.removesContentLength(bm, f.sendsResponseHeaders()), false); err != nil {
				return f.processingError(err)
			}
			if cr.GetBodyMutation().GetStreamedResponse() != nil {
				return f.spurious("streamed_response outside FULL_DUPLEX_STREAMED")
			}
			out = mutatedBody(cr.GetBodyMutation(), data)
			if cr.GetBodyMutation() != nil {
				if _, ok := h.get("content-length"); ok {
					h.set("content-length", itoa(len(out)))
				}
			}
		}
	} else if !errors.Is(err, errBypass) {
		return err
	}
	if hasTrailers && !f.complete {
		if err := f.send(trailersMsg(false, trailers)); err == nil {
			if tr, err := f.awaitResp(f.messageTimeout(), isResponseTrailers); err == nil {
				f.applyTrailersAnswer(false, tr, trailers)
			}
		}
	}
	d.writeHeaders(h)
	if _, err := d.Write(out); err != nil {
		return err
	}
	if rest != nil {
		return copyFlush(d, rest)
	}
	return nil
}

// copyFlush copies a body downstream, flushing each read so server-sent events are not held back.
func copyFlush(d *downstream, r io.Reader) error {
	for {
		chunk, eof, err := readChunk(r)
		if err != nil {
			return err
		}
		if len(chunk) > 0 {
			if _, err := d.Write(chunk); err != nil {
				return err
			}
			d.Flush()
		}
		if eof {
			return nil
		}
	}
}
