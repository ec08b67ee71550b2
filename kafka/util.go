package kafka

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
)

func jsonValid(b []byte) bool { return json.Valid(b) }

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// newProducerID draws a producer id: 62 random bits, so that the ids of
// gateways that share nothing but the database do not meet (one pair in
// 2^62), and a restarted gateway never gives out an id again.
func newProducerID() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return int64(binary.BigEndian.Uint64(b[:]) >> 2)
}
