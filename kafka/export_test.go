package kafka

import "github.com/twmb/franz-go/pkg/kmsg"

// ParseRequest decodes a request frame (after its size) as the server
// does.
func ParseRequest(frame []byte) (kmsg.Request, error) {
	req, _, _, err := parseRequest(frame)
	return req, err
}

// ParseProduced decodes the records of one partition of a Produce request
// as the endpoint does, decompressing at most limit bytes per batch; it
// returns how many records they hold.
func ParseProduced(raw []byte, limit int) (int, error) {
	b, err := parseProduced(raw, limit)
	return len(b.records), err
}
