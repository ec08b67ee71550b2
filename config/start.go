package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Start is a parsed startFrom value: where a group starts reading.
type Start struct {
	// Kind is "earliest", "latest", "offset" or "time".
	Kind string
	// Offset is the offset of Kind "offset".
	Offset int64
	// Time is the time of Kind "time".
	Time time.Time
}

// String returns the value in the form ParseStart reads.
func (s Start) String() string {
	switch s.Kind {
	case "offset":
		return "offset:" + strconv.FormatInt(s.Offset, 10)
	case "time":
		return "time:" + s.Time.Format(time.RFC3339Nano)
	}
	return s.Kind
}

// ParseStart parses "earliest", "latest", "offset:N" (N ≥ 1) or
// "time:<RFC 3339>".
func ParseStart(v string) (Start, error) {
	switch {
	case v == "earliest" || v == "latest":
		return Start{Kind: v}, nil
	case strings.HasPrefix(v, "offset:"):
		n, err := strconv.ParseInt(strings.TrimPrefix(v, "offset:"), 10, 64)
		if err != nil || n < 1 {
			return Start{}, fmt.Errorf("offset:N needs an offset of at least 1, got %q", v)
		}
		return Start{Kind: "offset", Offset: n}, nil
	case strings.HasPrefix(v, "time:"):
		t, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(v, "time:"))
		if err != nil {
			return Start{}, fmt.Errorf("time:T needs an RFC 3339 timestamp such as time:2026-01-31T12:00:00Z, got %q", v)
		}
		return Start{Kind: "time", Time: t}, nil
	}
	return Start{}, errors.New(`must be earliest, latest, offset:N or time:<RFC 3339>, got "` + v + `"`)
}

// ParseDuration parses a Go duration ("36h", "90m") or a number of days
// with the suffix "d" ("7d", "1.5d").
func ParseDuration(v string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q", v)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	return time.ParseDuration(v)
}
