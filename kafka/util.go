package kafka

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"unicode/utf8"
)

// newProducerID draws a producer id: 62 random bits, so that the ids of
// gateways that share nothing but the database do not meet (one pair in
// 2^62), and a restarted gateway never gives out an id again.
func newProducerID() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return int64(binary.BigEndian.Uint64(b[:]) >> 2)
}

// isText reports whether b can be stored in a text column: UTF-8 without
// NUL.
func isText(b []byte) bool {
	return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0
}

// isJSONBText reports whether b, valid JSON, can be stored as jsonb: UTF-8,
// no \u0000 escape, and every \u escape of a UTF-16 surrogate in a pair.
// (Numbers beyond numeric's range are refused by the database itself.)
func isJSONBText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	// In valid JSON a backslash is only ever an escape inside a string.
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		if i+1 < len(b) && b[i+1] != 'u' {
			i++ // \" \\ \/ \b \f \n \r \t
			continue
		}
		r, ok := hex4(b, i+2)
		if !ok {
			return false
		}
		switch {
		case r == 0:
			return false
		case r >= 0xDC00 && r <= 0xDFFF:
			return false // a low surrogate without a high one before it
		case r >= 0xD800 && r <= 0xDBFF:
			lo, ok := hex4(b, i+8)
			if !ok || b[i+6] != '\\' || b[i+7] != 'u' || lo < 0xDC00 || lo > 0xDFFF {
				return false
			}
			i += 11
		default:
			i += 5
		}
	}
	return true
}

// hex4 reads the four hexadecimal digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
