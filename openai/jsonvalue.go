package openai

// Reading values in place: a request body is validated once by scanBody and then read where it lies, value by
// value, so no reading of it allocates per element. These helpers take values cut from a validated body; on
// anything else they stop early rather than fail.

// valueEnd returns the index just past the value that starts at b[i], or i when none does.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		end, err := skipString(b, i+1)
		if err != nil {
			return i
		}
		return end + 1
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, err := skipString(b, j+1)
				if err != nil {
					return i
				}
				j = end
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return i
	}
	j := i
	for j < len(b) {
		switch b[j] {
		case ' ', '\t', '\n', '\r', ',', ']', '}', ':':
			return j
		}
		j++
	}
	return j
}

// Cursor walks the elements of an array or the members of an object, in order.
type Cursor struct {
	b []byte
	i int
}

// Elements walks the elements of arr; none when arr is not an array.
func Elements(arr []byte) Cursor {
	if len(arr) < 2 || arr[0] != '[' {
		return Cursor{}
	}
	return Cursor{b: arr, i: 1}
}

// Members walks the members of obj; none when obj is not an object.
func Members(obj []byte) Cursor {
	if len(obj) < 2 || obj[0] != '{' {
		return Cursor{}
	}
	return Cursor{b: obj, i: 1}
}

// Next returns the next element of an array.
func (c *Cursor) Next() ([]byte, bool) {
	i, ok := c.start()
	if !ok {
		return nil, false
	}
	end := valueEnd(c.b, i)
	if end <= i {
		c.i = len(c.b)
		return nil, false
	}
	c.i = end
	return c.b[i:end], true
}

// NextMember returns the next member of an object: its key as written (between the quotes, escapes kept) and
// its value.
func (c *Cursor) NextMember() (key, value []byte, ok bool) {
	i, ok := c.start()
	if !ok {
		return nil, nil, false
	}
	if c.b[i] != '"' {
		c.i = len(c.b)
		return nil, nil, false
	}
	keyEnd, err := skipString(c.b, i+1)
	if err != nil {
		c.i = len(c.b)
		return nil, nil, false
	}
	j := skipSpace(c.b, keyEnd+1)
	if j >= len(c.b) || c.b[j] != ':' {
		c.i = len(c.b)
		return nil, nil, false
	}
	j = skipSpace(c.b, j+1)
	end := valueEnd(c.b, j)
	if end <= j {
		c.i = len(c.b)
		return nil, nil, false
	}
	c.i = end
	return c.b[i+1 : keyEnd], c.b[j:end], true
}

// start skips to the next element, past a comma; false at the end.
func (c *Cursor) start() (int, bool) {
	i := skipSpace(c.b, c.i)
	if i < len(c.b) && c.b[i] == ',' {
		i = skipSpace(c.b, i+1)
	}
	if i >= len(c.b) || c.b[i] == ']' || c.b[i] == '}' {
		c.i = i // at the closing bracket, where the value ends (NextObject), or past the end
		return 0, false
	}
	return i, true
}

// Member is the value of obj's first member named name (its key decoded as the engine decodes it), nil when
// obj is no object or has none.
func Member(obj []byte, name string) []byte {
	c := Members(obj)
	for {
		key, value, ok := c.NextMember()
		if !ok {
			return nil
		}
		if keyIs(key, name) {
			return value
		}
	}
}

// keyIs reports whether a key as written (escapes kept) decodes to name, as the engine decodes it.
func keyIs(key []byte, name string) bool {
	var buf [32]byte
	k, ok := decodeKey(buf[:0], key)
	return ok && string(k) == name
}

// NextObject is Next for an array of objects read member by member: it returns the next element and, when it
// is an object, fills values[i] with the value of its first member named names[i] (nil when it has none; keys
// decoded as Member decodes them), walking the element once where Next and a Member call per name would walk it
// once each. values holds at least len(names) slots and is cleared first. On a valid array it returns what Next
// does; on a malformed object it ends the walk, where Next, which counts brackets only, may not.
func (c *Cursor) NextObject(names []string, values [][]byte) (item []byte, isObject, ok bool) {
	clear(values)
	i, ok := c.start()
	if !ok {
		return nil, false, false
	}
	if c.b[i] != '{' {
		item, ok = c.Next()
		return item, false, ok
	}
	obj := Cursor{b: c.b[i:], i: 1}
	obj.fill(names, values)
	// The walk stops at the object's closing brace, or at the end of the bytes when it is cut short.
	if obj.i >= len(obj.b) || obj.b[obj.i] != '}' {
		c.i = len(c.b)
		return nil, false, false
	}
	end := i + obj.i + 1
	c.i = end
	return c.b[i:end], true, true
}

// fill walks the rest of an object's members, to its end, taking the first value of each name into values.
func (c *Cursor) fill(names []string, values [][]byte) {
	missing := len(names)
	for {
		key, value, ok := c.NextMember()
		if !ok {
			return
		}
		for i := 0; missing > 0 && i < len(names); i++ {
			if values[i] == nil && keyIs(key, names[i]) {
				values[i] = value
				missing--
				break
			}
		}
	}
}

// StringValue decodes a JSON string value; ok is false for any other value.
func StringValue(v []byte) (string, bool) { return stringValue(v) }

// Compact hands write the value's bytes without the whitespace between its tokens, in runs: the value as a
// compact encoder writes it, with every string's escapes as the client wrote them. Prefix hashes and
// conversation keys read prompts this way, so that spacing never splits a cache prefix.
func Compact(v []byte, write func([]byte)) {
	if len(v) > 0 && v[0] == '"' {
		// A string value has no whitespace between tokens: written whole, not scanned a second time.
		write(v)
		return
	}
	start := 0
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '"':
			end, err := skipString(v, i+1)
			if err != nil {
				write(v[start:])
				return
			}
			i = end
		case ' ', '\t', '\n', '\r':
			if i > start {
				write(v[start:i])
			}
			start = skipSpace(v, i)
			i = start - 1
		}
	}
	if start < len(v) {
		write(v[start:])
	}
}
