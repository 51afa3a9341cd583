package openai

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// The fields of a request body the gateway reads, by index into bodyIndex.
const (
	fieldModel = iota
	fieldPrompt
	fieldStream
	fieldStreamOptions
	fieldMaxTokens
	fieldMaxCompletionTokens
	fieldMaxOutputTokens
	fieldInstructions
	fieldN
	fieldBestOf
	fieldUser
	// The engines' prefill/decode protocol fields (vLLM's kv_transfer_params, SGLang's bootstrap address): a
	// gateway sets them on a disaggregated request's legs; from a client they would make an engine pull KV
	// cache from, or hand it to, an address of the client's choosing.
	fieldKVTransferParams
	fieldBootstrapHost
	fieldBootstrapPort
	fieldBootstrapRoom
	numFields
)

// fieldNames are the keys of the fields, but for the prompt's, which depends on the endpoint.
var fieldNames = [numFields]string{
	fieldModel: "model", fieldStream: "stream", fieldStreamOptions: "stream_options",
	fieldMaxTokens: "max_tokens", fieldMaxCompletionTokens: "max_completion_tokens",
	fieldMaxOutputTokens: "max_output_tokens", fieldInstructions: "instructions", fieldN: "n",
	fieldBestOf: "best_of", fieldUser: "user", fieldKVTransferParams: "kv_transfer_params",
	fieldBootstrapHost: "bootstrap_host", fieldBootstrapPort: "bootstrap_port", fieldBootstrapRoom: "bootstrap_room",
}

// span locates a value in the body: [start, end), end 0 when absent.
type span struct{ start, end int }

// fieldAt is one top-level field the scan found, in body order.
type fieldAt struct {
	field    int
	value    span
	repeated bool // the key had been seen already
}

// bodyIndex is what scanBody finds at a body's top level: whether it is an object, where that object ends,
// and the fields routing reads in body order — fixed-size, so indexing a body allocates nothing whatever it
// holds. Recording stops at the first repeated key, the body's first field error but for type errors before it.
type bodyIndex struct {
	promptField string
	object      bool
	end         int // just past the top-level object's '}'
	seen        [numFields]bool
	fields      [numFields + 1]fieldAt
	n           int
	stopped     bool
	// the prompt's elements when it is an array, counted as the scan passes them: chat needs at least one,
	// all objects
	promptItems      int
	promptNonObjects bool
}

// promptItem counts an element of an array prompt that starts with c.
func (x *bodyIndex) promptItem(c byte) {
	x.promptItems++
	x.promptNonObjects = x.promptNonObjects || c != '{'
}

// fieldOf names the field a top-level key stands for, -1 for the fields routing does not read. A key written
// with escapes ("mod\u0065l") is the key it decodes to, as the engine reads it.
func (x *bodyIndex) fieldOf(raw []byte) int {
	var buf [32]byte
	key, ok := decodeKey(buf[:0], raw)
	if !ok {
		return -1
	}
	if x.promptField != "" && string(key) == x.promptField {
		return fieldPrompt
	}
	for f, name := range fieldNames {
		if name != "" && string(key) == name {
			return f
		}
	}
	return -1
}

// found records a top-level field's value. A repeated "user" replaces the earlier one (it only labels usage);
// any other repeated field is recorded as such and ends the recording.
func (x *bodyIndex) found(field, start, end int) {
	if x.stopped {
		return
	}
	if x.seen[field] && field == fieldUser {
		for i := range x.fields[:x.n] {
			if x.fields[i].field == fieldUser {
				x.fields[i].value = span{start, end}
			}
		}
		return
	}
	x.fields[x.n] = fieldAt{field: field, value: span{start, end}, repeated: x.seen[field]}
	x.n++
	x.stopped = x.seen[field]
	x.seen[field] = true
}

// maxKeyEscapedBytes bounds the escaped keys decoded: the longest field name written with one \uXXXX per
// character.
const maxKeyEscapedBytes = 6 * 32

// decodeKey decodes a key's escapes into dst when they stand for ASCII (every field name is ASCII); ok is
// false for a key that cannot be a field name.
func decodeKey(dst, raw []byte) ([]byte, bool) {
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw, true
	}
	if len(raw) > maxKeyEscapedBytes {
		return nil, false
	}
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			dst = append(dst, c)
			continue
		}
		// The scan has checked every escape: a letter follows, or u and four hex digits.
		switch raw[i+1] {
		case 'u':
			r := hexValue(raw[i+2 : i+6])
			if r >= utf8.RuneSelf {
				return nil, false
			}
			dst = append(dst, byte(r))
			i += 5
		case '"', '\\', '/':
			dst = append(dst, raw[i+1])
			i++
		default: // \b \f \n \r \t: control characters, in no field name
			return nil, false
		}
	}
	return dst, true
}

func hexValue(h []byte) rune {
	var r rune
	for _, c := range h {
		r <<= 4
		switch {
		case '0' <= c && c <= '9':
			r |= rune(c - '0')
		case 'a' <= c && c <= 'f':
			r |= rune(c - 'a' + 10)
		case 'A' <= c && c <= 'F':
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// stringValue decodes a JSON string value; ok is false for any other value. A string without escapes is
// copied as it is; one with escapes goes through encoding/json.
func stringValue(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	inner := v[1 : len(v)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner), true
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", false
	}
	return s, true
}
