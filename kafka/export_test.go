package kafka

import (
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

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

// WaitingOn returns the partitions of pgevents topic id that fetches wait
// on, each with the high watermark a fetch waits at.
func (s *Server) WaitingOn(id int) map[int32]int64 {
	s.waits.mu.Lock()
	defer s.waits.mu.Unlock()
	out := map[int32]int64{}
	for wt := range s.waits.set {
		for _, pt := range wt.points {
			if pt.topic == id {
				out[pt.partition] = pt.hw
			}
		}
	}
	return out
}

// SetRefusalInterval sets how often the server logs one kind of refusal
// of one client.
func (s *Server) SetRefusalInterval(d time.Duration) {
	s.refusals.mu.Lock()
	defer s.refusals.mu.Unlock()
	s.refusals.every = d
}
