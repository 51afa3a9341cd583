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
}

func (e *scanError) Error() string { return fmt.Sprintf("%s at offset %d", e.reason, e.offset) }

// preScan walks a JSON text once, without recursion, before any recursive parser sees it: it bounds nesting
// depth and refuses raw control characters inside strings (including object keys), which the recursive
// validator misses when a string also holds an escape. It does not check the grammar: the parser does that
// next, on a body now known to be shallow.
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
				return -1, -1, &scanError{i, fmt.Sprintf("nesting deeper than %d levels", maxDepth)}
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
		default:
			if depth == 1 && capturing { // a bare value: null, a number, true or false
				start, capturing = i, false
				for end = i + 1; end < len(b) && b[end] != ',' && b[end] != '}' && b[end] > ' '; end++ {
				}
				i = end - 1
			}
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
			return 0, &scanError{len(b), "unterminated string"}
		}
		i += j
		switch c := b[i]; {
		case c == '"':
			return i, nil
		case c == '\\':
			i += 2 // the escaped byte is never a terminator; the parser checks the escape itself
			if i > len(b) {
				return 0, &scanError{len(b), "unterminated string"}
			}
		default:
			return 0, &scanError{i, fmt.Sprintf("raw control character 0x%02X inside a string", c)}
		}
	}
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
