package audit

import (
	"bufio"
	"fmt"
	"io"
)

// sink is where the writer goroutine puts encoded lines. Only that goroutine calls it.
type sink interface {
	// write appends one line (ending in '\n') for tenant; an error means the line was lost.
	write(tenant string, line []byte) error
	// flush hands buffered lines to the operating system, so a reader sees them.
	flush() error
	// close flushes and releases what the sink holds.
	close() error
}

// outSink writes every tenant's lines to one io.Writer, such as os.Stdout.
type outSink struct {
	out     io.Writer
	w       *bufio.Writer
	pending int       // lines in w
	written func(int) // counts lines once flushed
}

func newOutSink(out io.Writer, written func(int)) *outSink {
	return &outSink{out: out, w: bufio.NewWriterSize(out, bufSize), written: written}
}

func (s *outSink) write(_ string, line []byte) error {
	if _, err := s.w.Write(line); err != nil {
		s.reset()
		return fmt.Errorf("audit: write: %w", err)
	}
	s.pending++
	return nil
}

func (s *outSink) flush() error {
	if err := s.w.Flush(); err != nil {
		s.reset()
		return fmt.Errorf("audit: flush: %w", err)
	}
	s.written(s.pending)
	s.pending = 0
	return nil
}

// reset drops what w holds: a bufio.Writer keeps its first error, so the next line starts over.
func (s *outSink) reset() {
	s.w.Reset(s.out)
	s.pending = 0
}

// close flushes; Out belongs to the caller, who closes it.
func (s *outSink) close() error { return s.flush() }
