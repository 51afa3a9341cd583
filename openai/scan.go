package openai

import (
	"encoding/binary"
	"fmt"
)

// MaxJSONDepth bounds how deeply objects and arrays may nest in a body the gateway parses. Real requests
// (messages with tool calls and JSON-schema response formats) stay well under 64; the bound is what keeps a
// hostile body of a million '[' from exhausting the stack of a recursive parser.
const MaxJSONDepth = 128

// scanError says why preScan refused a body; offset is where it stopped.
type scanError struct {
	offset int
	reason string
	// grammar marks a body that is not JSON at all (encoding/json describes those better); the others are
	// JSON the gateway refuses (too deep).
	grammar bool
}

func (e *scanError) Error() string { return fmt.Sprintf("%s at offset %d", e.reason, e.offset) }

// preScan walks a JSON text once, without recursion, before any recursive parser sees it: it bounds nesting
// depth, refuses raw control characters inside strings (including object keys), checks every escape, number
// and literal — what the parser leaves unchecked — and leaves the structure (where commas, colons and keys go)
// to the parser, which checks it next, on a body now known to be shallow. The two together accept exactly
// what a JSON validator does, in two walks of the body instead of three.
func preScan(b []byte, maxDepth int) error {
	_, _, err := scanBody(b, maxDepth, "")
	return err
}

// scanBody is preScan that also finds, on the way, the bytes of the value of the top-level key named key
// (written without escapes): start and end are -1 when there is none. The span costs the scan nothing but a
// look at the top level's few keys.
func scanBody(b []byte, maxDepth int, key string) (start, end int, err error) {
	start, end = -1, -1
	depth := 0
	expectKey := false // at depth 1, the next string is a key
	capturing := false // the wanted key was seen: its value starts at the next non-space byte
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '[', '{':
			if depth++; depth > maxDepth {
				return -1, -1, &scanError{i, fmt.Sprintf("nesting deeper than %d levels", maxDepth), false}
			}
			if depth == 2 && capturing {
				start, capturing = i, false
			}
			expectKey = depth == 1 && c == '{'
		case ']', '}':
			depth--
			if depth == 1 && start >= 0 && end < 0 {
				end = i + 1
			}
		case ',':
			expectKey = depth == 1
		case '"':
			close, err := skipString(b, i+1)
			if err != nil {
				return -1, -1, err
			}
			switch {
			case depth == 1 && expectKey:
				expectKey = false
				capturing = key != "" && start < 0 && string(b[i+1:close]) == key
			case depth == 1 && capturing:
				start, end, capturing = i, close+1, false
			}
			i = close
		case ' ', '\t', '\n', '\r', ':':
		default: // a bare value: a number, true, false or null
			after, err := scanScalar(b, i)
			if err != nil {
				return -1, -1, err
			}
			if depth == 1 && capturing {
				start, end, capturing = i, after, false
			}
			i = after - 1
		}
	}
	if end < 0 {
		start = -1
	}
	return start, end, nil
}

// skipString returns the index of the quote that closes the string starting at i, or an error for a raw
// control character or a missing end.
func skipString(b []byte, i int) (int, error) {
	for {
		// Find the next byte that needs a look: a quote, a backslash or a control character.
		j := indexStringSpecial(b[i:])
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

// scanScalar checks the number or literal (true, false, null) at b[i] and returns the index just past it,
// where a delimiter must follow: the parser reads "01" or "1.5.3" as one number.
func scanScalar(b []byte, i int) (int, error) {
	end, err := scanLiteralOrNumber(b, i)
	if err != nil {
		return 0, err
	}
	if end < len(b) {
		switch b[end] {
		case ' ', '\t', '\n', '\r', ',', ']', '}':
		default:
			return 0, &scanError{end, "invalid character after a value", true}
		}
	}
	return end, nil
}

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
