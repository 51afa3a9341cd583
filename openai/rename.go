package openai

// ModelRenamer replaces the value of a JSON response's top-level "model" as the body streams through, chunk
// by chunk, holding nothing back: it follows the document's strings and nesting across chunk boundaries, and
// renames the value when the value's string lies within one chunk (a value cut by a chunk boundary, which real
// responses do not do — the key sits in the first bytes — is left as it is). The zero value is unusable: set
// Name.
type ModelRenamer struct {
	// Name is the replacement, a JSON string with its quotes.
	Name []byte

	done     bool
	depth    int
	inString bool
	escaped  bool
	key      []byte // the depth-1 string being read, up to len("model")+1 bytes
	keyLong  bool
	expect   int // 0: nothing; 1: after the "model" key, a ':'; 2: after the ':', the value
	isKey    bool
}

// Process returns the chunk to forward: chunk itself when nothing in it changes.
func (r *ModelRenamer) Process(chunk []byte) []byte {
	if r.done {
		return chunk
	}
	for i := 0; i < len(chunk); i++ {
		c := chunk[i]
		if r.inString {
			switch {
			case r.escaped:
				r.escaped = false
			case c == '\\':
				r.escaped = true
			case c == '"':
				r.inString = false
				r.endString()
			}
			if r.inString && r.depth == 1 && r.isKey {
				r.keyByte(c)
			}
			continue
		}
		switch c {
		case '{', '[':
			r.depth++
			r.expect = 0
		case '}', ']':
			r.depth--
			r.expect = 0
			if r.depth <= 0 {
				r.done = true // the document ended without a model
				return chunk
			}
		case ':':
			if r.expect == 1 {
				r.expect = 2
			}
		case ',':
			r.expect = 0
		case ' ', '\t', '\n', '\r':
		case '"':
			if r.expect == 2 {
				r.done = true
				return r.replaceValue(chunk, i)
			}
			r.inString, r.escaped, r.key, r.keyLong = true, false, r.key[:0], false
			r.isKey = r.depth == 1
		default:
			r.expect = 0
		}
	}
	return chunk
}

func (r *ModelRenamer) keyByte(c byte) {
	if len(r.key) > len("model") {
		r.keyLong = true
		return
	}
	r.key = append(r.key, c)
}

// endString notes a finished depth-1 string: the "model" key makes the next value the one to rename.
func (r *ModelRenamer) endString() {
	if r.depth == 1 && r.isKey && !r.keyLong && string(r.key) == "model" {
		r.expect = 1
		return
	}
	r.expect = 0
}

// replaceValue renames the string value starting at chunk[at] when it ends within the chunk.
func (r *ModelRenamer) replaceValue(chunk []byte, at int) []byte {
	end, err := skipString(chunk, at+1)
	if err != nil {
		return chunk // cut by the chunk's end (or malformed): left as it came
	}
	out := make([]byte, 0, len(chunk)-(end+1-at)+len(r.Name))
	out = append(out, chunk[:at]...)
	out = append(out, r.Name...)
	return append(out, chunk[end+1:]...)
}
