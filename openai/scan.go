package openai

import (
	"encoding/binary"
	"fmt"
	"runtime"
)

// MaxNumberBytes bounds a JSON number: no field of a request needs more than a few dozen digits, and a number of
// megabytes would be scanned in one slice, which a large body's budget cannot divide (scan.go).
const MaxNumberBytes = 1024

// MaxJSONDepth bounds how deeply objects and arrays may nest in a body the gateway parses. Real requests
// (messages with tool calls and JSON-schema response formats) stay well under 64; the bound is what keeps a
// hostile body of a million '[' from exhausting the stack of a recursive parser.
const MaxJSONDepth = 128

// scanError says why scanBody refused a body; offset is where it stopped.
type scanError struct {
	offset int
	reason string
	// grammar marks a body that is not JSON at all (encoding/json describes those better); the others are
	// JSON the gateway refuses (too deep).
	grammar bool
}

func (e *scanError) Error() string { return fmt.Sprintf("%s at offset %d", e.reason, e.offset) }

// LargeBodyBytes is the size past which a body is large: its scan gives way to other work every yieldEvery
// bytes (2-100 µs, the more elements the longer), so a 4 MiB one gives way 512 times; an ordinary prompt is
// scanned in one go. The gateway gives large bodies' other work way past the same size.
const LargeBodyBytes = 64 << 10

const yieldEvery = 8 << 10

// budget spends a large body's scan in slices, calling yield between them: between tokens and inside long
// strings and runs of whitespace alike (numbers are short: MaxNumberBytes).
type budget struct {
	yield func() // nil: an ordinary body, scanned in one go
	every int
	next  int // the offset past which to yield next
}

// spend yields when the scan has reached i at or past the end of its slice.
func (b *budget) spend(i int) {
	if b.yield != nil && i >= b.next {
		b.yield()
		b.next = i + b.every
	}
}

// limit is where the current slice ends, n when nothing yields.
func (b *budget) limit(n int) int {
	if b.yield == nil {
		return n
	}
	return min(n, b.next)
}

// scanState is what the grammar allows next.
type scanState uint8

const (
	wantValue      scanState = iota // a value: at the start, after ':' and after ',' in an array
	wantValueOrEnd                  // just after '['
	wantKey                         // after ',' in an object
	wantKeyOrEnd                    // just after '{'
	wantColon                       // after a key
	wantCommaOrEnd                  // after a value inside an array or object
	wantNothing                     // after the top-level value
)

// containers is a stack of one bit per open array or object (set: object), deep enough for MaxJSONDepth.
type containers [MaxJSONDepth/64 + 1]uint64

func (c *containers) set(depth int, object bool) {
	if object {
		c[depth/64] |= 1 << (depth % 64)
	} else {
		c[depth/64] &^= 1 << (depth % 64)
	}
}

func (c *containers) object(depth int) bool { return c[depth/64]&(1<<(depth%64)) != 0 }

// preScan validates a JSON text (scanBody without a field index).
func preScan(b []byte, maxDepth int) error {
	return scanBody(b, maxDepth, nil, runtime.Gosched)
}

// scanBody validates a JSON text in one walk, without recursion and without allocating: nesting is bounded by
// maxDepth (a body of a million '[' costs a counter, never a stack), every string, escape, number, literal and
// the structure between them are checked — exactly what a JSON validator accepts, and raw control characters
// in strings refused. When idx is not nil it is handed each top-level key and told where that key's value
// lies, so the fields routing reads are found in the same walk: nothing of the body is materialised, however
// many elements it holds in fields the gateway ignores. A large body takes milliseconds to scan: yield lets
// the requests waiting for this CPU go first, every yieldEvery bytes of a large body (budget).
func scanBody(b []byte, maxDepth int, idx *bodyIndex, yield func()) error {
	s := scanner{b: b, maxDepth: maxDepth, idx: idx, state: wantValue, field: -1}
	if len(b) > LargeBodyBytes && yield != nil {
		s.budget = budget{yield: yield, every: yieldEvery, next: yieldEvery}
	}
	for {
		s.budget.spend(s.i)
		end := s.budget.limit(len(b))
		if s.i = skipSpace(b[:end], s.i); s.i == end && end < len(b) {
			continue // a long run of whitespace: its next slice
		}
		if s.i >= len(b) {
			if s.state != wantNothing {
				return &scanError{len(b), "unexpected end of JSON input", true}
			}
			return nil
		}
		if err := s.step(b[s.i]); err != nil {
			return err
		}
	}
}

// scanner is scanBody's state between tokens.
type scanner struct {
	b        []byte
	i        int // the next byte to read
	maxDepth int
	idx      *bodyIndex
	budget   budget
	open     containers
	depth    int
	state    scanState
	// field is the indexed top-level field whose value comes or is being read (-1: none), starting at
	// fieldStart.
	field, fieldStart int
}

// step reads the token that starts with c, at s.i.
func (s *scanner) step(c byte) error {
	switch s.state {
	case wantNothing:
		return &scanError{s.i, "invalid character after the top-level value", true}
	case wantColon:
		if c != ':' {
			return &scanError{s.i, "invalid character after an object key", true}
		}
		s.state = wantValue
		s.i++
		return nil
	case wantCommaOrEnd:
		return s.afterValue(c)
	case wantKey, wantKeyOrEnd:
		if c == '}' && s.state == wantKeyOrEnd {
			s.close() // an empty object
			return nil
		}
		return s.key(c)
	}
	if c == ']' && s.state == wantValueOrEnd {
		s.close() // an empty array
		return nil
	}
	return s.value(c)
}

// afterValue reads what follows a value inside a container: a comma, or the container's end.
func (s *scanner) afterValue(c byte) error {
	object := s.open.object(s.depth)
	switch {
	case c == ',' && object:
		s.state = wantKey
	case c == ',':
		s.state = wantValue
	case c == '}' && object, c == ']' && !object:
		s.close()
		return nil
	default:
		return &scanError{s.i, "invalid character after a value", true}
	}
	s.i++
	return nil
}

// key reads an object key; at the top level the index learns which field it names.
func (s *scanner) key(c byte) error {
	if c != '"' {
		return &scanError{s.i, "invalid character where an object key belongs", true}
	}
	end, err := skipStringIn(s.b, s.i+1, &s.budget)
	if err != nil {
		return err
	}
	if s.depth == 1 && s.idx != nil {
		s.field = s.idx.fieldOf(s.b[s.i+1 : end])
	}
	s.state = wantColon
	s.i = end + 1
	return nil
}

// value reads a value: it opens a container, or reads a string, number or literal whole.
func (s *scanner) value(c byte) error {
	if s.depth == 1 {
		s.fieldStart = s.i
	}
	if s.depth == 2 && s.field == fieldPrompt && !s.open.object(2) {
		s.idx.promptItem(c) // idx is set: field is
	}
	var end int
	var err error
	switch {
	case c == '{' || c == '[':
		if s.depth++; s.depth > s.maxDepth {
			return &scanError{s.i, fmt.Sprintf("nesting deeper than %d levels", s.maxDepth), false}
		}
		s.open.set(s.depth, c == '{')
		if s.depth == 1 && s.idx != nil {
			s.idx.object = c == '{'
		}
		s.state = wantValueOrEnd
		if c == '{' {
			s.state = wantKeyOrEnd
		}
		s.i++
		return nil
	case c == '"':
		end, err = skipStringIn(s.b, s.i+1, &s.budget)
		end++
	case c == '-' || isDigit(c): // numbers first: they are what long arrays hold
		end, err = scanNumber(s.b, s.i)
	default:
		end, err = scanLiteralOrNumber(s.b, s.i)
	}
	if err != nil {
		return err
	}
	s.i = end
	s.valueEnded()
	return nil
}

// close reads the byte that closes the innermost container, which is a value of the one around it.
func (s *scanner) close() {
	s.depth--
	s.i++
	if s.depth == 0 && s.idx != nil {
		s.idx.end = s.i
	}
	s.valueEnded()
}

// valueEnded moves the scan on past a value that ended at s.i, handing a top-level field's value to the index.
func (s *scanner) valueEnded() {
	switch {
	case s.depth == 0:
		s.state, s.field = wantNothing, -1
	case s.depth == 1 && s.field >= 0:
		s.idx.found(s.field, s.fieldStart, s.i)
		s.state, s.field = wantCommaOrEnd, -1
	default:
		s.state = wantCommaOrEnd
	}
}

// skipSpace returns the index of the first byte at or after i that is not JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipString returns the index of the quote that closes the string starting at i, or an error for a raw
// control character or a missing end.
func skipString(b []byte, i int) (int, error) { return skipStringIn(b, i, nil) }

// skipStringIn is skipString spending a large body's budget (nil: none): it yields between slices of a long
// string.
func skipStringIn(b []byte, i int, bud *budget) (int, error) {
	for {
		end := len(b)
		if bud != nil {
			bud.spend(i)
			end = bud.limit(end)
		}
		// Find the next byte that needs a look: a quote, a backslash or a control character.
		j := indexStringSpecial(b[i:end])
		if j < 0 && end < len(b) {
			i = end // nothing to look at before the slice's end: the string goes on
			continue
		}
		if j < 0 {
			return 0, &scanError{len(b), "unterminated string", false}
		}
		i += j
		switch c := b[i]; {
		case c == '"':
			return i, nil
		case c == '\\':
			next, err := skipEscape(b, i)
			if err != nil {
				return 0, err
			}
			i = next
		default:
			return 0, &scanError{i, fmt.Sprintf("raw control character 0x%02X inside a string", c), false}
		}
	}
}

// skipEscape checks the escape at b[i] (a backslash) and returns the index just past it.
func skipEscape(b []byte, i int) (int, error) {
	if i+1 >= len(b) {
		return 0, &scanError{len(b), "unterminated string", false}
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return i + 2, nil
	case 'u':
		if i+6 > len(b) {
			return 0, &scanError{len(b), "unterminated string", false}
		}
		for _, h := range b[i+2 : i+6] {
			if !isHex(h) {
				return 0, &scanError{i, "invalid \\u escape inside a string", true}
			}
		}
		return i + 6, nil
	}
	return 0, &scanError{i, fmt.Sprintf("invalid escape \\%c inside a string", b[i+1]), true}
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func scanLiteralOrNumber(b []byte, i int) (int, error) {
	for _, lit := range [...]string{"true", "false", "null"} {
		if b[i] == lit[0] {
			if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
				return 0, &scanError{i, "invalid literal", true}
			}
			return i + len(lit), nil
		}
	}
	return scanNumber(b, i)
}

// scanNumber checks a JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(b []byte, i int) (int, error) {
	j := i
	if b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case j < len(b) && '1' <= b[j] && b[j] <= '9':
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	default:
		return 0, &scanError{j, "invalid character outside a string", true}
	}
	if j < len(b) && b[j] == '.' {
		if j++; j >= len(b) || !isDigit(b[j]) {
			return 0, &scanError{j, "missing digits after a decimal point", true}
		}
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		if j++; j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if j >= len(b) || !isDigit(b[j]) {
			return 0, &scanError{j, "missing digits in an exponent", true}
		}
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	}
	if j-i > MaxNumberBytes {
		return 0, &scanError{i, fmt.Sprintf("a number longer than %d bytes", MaxNumberBytes), false}
	}
	return j, nil
}

// stringSpecial marks the bytes a string scan must stop at: '"', '\\' and the control characters.
var stringSpecial = func() (t [256]bool) {
	for c := 0; c < 0x20; c++ {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// indexStringSpecial finds the first '"', '\\' or byte below 0x20. Prompt text is nearly all of a body and
// nearly none of it is special, so eight bytes are tested at once (SWAR) and only a word that holds a special
// byte is looked at byte by byte: linear however many escapes a string holds, and several times faster than a
// table look-up per byte.
func indexStringSpecial(b []byte) int {
	k := 0
	for ; k+8 <= len(b); k += 8 {
		if special8(binary.LittleEndian.Uint64(b[k:])) {
			break
		}
	}
	for ; k < len(b); k++ {
		if stringSpecial[b[k]] {
			return k
		}
	}
	return -1
}

// special8 reports whether any of the eight bytes in v is '"', '\\' or below 0x20, with the exact
// "has a zero byte" and "has a byte less than n" word tricks (bytes of 0x80 and above never match).
func special8(v uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	quote, backslash := v^(ones*'"'), v^(ones*'\\')
	zeroQuote := (quote - ones) &^ quote
	zeroBackslash := (backslash - ones) &^ backslash
	control := (v - ones*0x20) &^ v
	return (zeroQuote|zeroBackslash|control)&highs != 0
}
