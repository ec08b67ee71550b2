// Package logtest is the log destination of the tests: a buffer safe for
// concurrent writes, read while it is written, that checks every JSON log
// line written to it against the rules pgevents' logs keep, so that every
// line a test makes a consumer, a sequencer, the console or a consumer
// process write is checked, not only the lines a test looks for.
//
// The rules (Check): a key appears once per object (most JSON log
// pipelines reject or silently drop a repeated key, and zerolog writes
// whatever it is given: a logger's context and an event can both add
// "topic"); numbers are integers, durations included, which are integer
// milliseconds under a key ending in _ms (zerolog's Dur writes a float
// without a unit); a key ending in _ms holds an integer.
//
// A line is a log line when it is a JSON object whose first key is
// "level", as zerolog writes them; other output (a log handler's events,
// a command's table) is not checked.
package logtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
)

// Buffer is a log destination that tests read while it is written, from
// any number of goroutines, and that checks each complete JSON log line
// written to it (see Check). Make one with New, which fails the test for
// each problem found. The zero Buffer is ready to use too, as the tests'
// one buffer safe for concurrent writes (a child process's stderr, say):
// it records what Check finds (Problems) but fails no test.
type Buffer struct {
	mu       sync.Mutex
	b        bytes.Buffer
	partial  []byte // the start of a line not yet ended
	problems []string
	ended    bool   // the test that owns it ended: problems go to late
	name     string // the test's name, for late problems
}

// Write appends p and checks the lines it completes.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.Write(p)
	b.partial = append(b.partial, p...)
	for {
		i := bytes.IndexByte(b.partial, '\n')
		if i < 0 {
			break
		}
		line := b.partial[:i]
		for _, pr := range Check(line) {
			msg := fmt.Sprintf("%s in log line %s", pr, line)
			if b.ended {
				addLate(b.name + ": " + msg)
			} else {
				b.problems = append(b.problems, msg)
			}
		}
		b.partial = b.partial[i+1:]
	}
	if len(b.partial) == 0 {
		b.partial = nil // let the lines go
	}
	return len(p), nil
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Problems returns what Check found in the lines written so far.
func (b *Buffer) Problems() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.problems...)
}

// New returns a Buffer that fails tb, when tb ends, for each problem Check
// finds in the lines written to it. Lines written after tb ended (a
// goroutine's last words) are checked too, and reported by Late.
func New(tb testing.TB) *Buffer {
	b := &Buffer{name: tb.Name()}
	tb.Cleanup(func() {
		b.mu.Lock()
		problems := b.problems
		b.ended = true
		b.mu.Unlock()
		for _, p := range problems {
			tb.Errorf("logtest: %s", p)
		}
	})
	return b
}

// Logger returns a JSON logger, at the trace level so that every line is
// written and checked, with a timestamp and the test's name, that writes to
// the Buffer New(tb) returns, and the lines at level show and above, as
// text, to stderr too (zerolog.Disabled: none), as the tests' loggers did
// before they were checked.
func Logger(tb testing.TB, show zerolog.Level) (zerolog.Logger, *Buffer) {
	b := New(tb)
	var w io.Writer = b
	if show != zerolog.Disabled {
		w = zerolog.MultiLevelWriter(b, &zerolog.FilteredLevelWriter{
			Writer: zerolog.LevelWriterAdapter{Writer: zerolog.ConsoleWriter{Out: os.Stderr, NoColor: true}},
			Level:  show,
		})
	}
	return zerolog.New(w).Level(zerolog.TraceLevel).With().Timestamp().Str("test", tb.Name()).Logger(), b
}

var (
	lateMu sync.Mutex
	late   []string
)

func addLate(p string) {
	lateMu.Lock()
	defer lateMu.Unlock()
	late = append(late, p)
}

// Late returns the problems found in lines written after the test that
// made their Buffer had ended; a package's TestMain fails the run when
// there are any (pgtest.Main does).
func Late() []string {
	lateMu.Lock()
	defer lateMu.Unlock()
	return append([]string(nil), late...)
}

// Check returns the problems of line, when it is a JSON log line (an
// object whose first key is "level"): each key repeated in an object,
// each number that is not an integer, each key ending in _ms whose value
// is not an integer. It returns nil for any other line.
func Check(line []byte) []string {
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	c := checker{dec: dec}
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil
	}
	first, err := dec.Token()
	if err != nil || first != "level" {
		return nil
	}
	if err := c.object("", first.(string)); err != nil {
		return nil // not JSON after all
	}
	return c.problems
}

// checker walks one JSON value with dec, collecting problems.
type checker struct {
	dec      *json.Decoder
	problems []string
}

// object reads the rest of an object whose '{' was read, and whose first
// key, when not "", was read too; path names it in problems.
func (c *checker) object(path, first string) error {
	seen := map[string]bool{}
	key := first
	for {
		if key == "" {
			tok, err := c.dec.Token()
			if err != nil {
				return err
			}
			if tok == json.Delim('}') {
				return nil
			}
			k, ok := tok.(string)
			if !ok {
				return fmt.Errorf("key %v", tok)
			}
			key = k
		}
		if seen[key] {
			c.problems = append(c.problems, fmt.Sprintf("key %q repeated", path+key))
		}
		seen[key] = true
		if err := c.value(path + key); err != nil {
			return err
		}
		key = ""
	}
}

// value reads one value, under key path.
func (c *checker) value(path string) error {
	tok, err := c.dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			return c.object(path+".", "")
		case '[':
			for c.dec.More() {
				if err := c.value(path + "[]"); err != nil {
					return err
				}
			}
			_, err := c.dec.Token() // ']'
			return err
		}
		return fmt.Errorf("unexpected %v", v)
	case json.Number:
		if strings.ContainsAny(v.String(), ".eE") {
			c.problems = append(c.problems, fmt.Sprintf("%q is %s, not an integer (a duration is integer milliseconds under a key ending in _ms)", path, v))
		}
		return nil
	}
	if strings.HasSuffix(path, "_ms") {
		c.problems = append(c.problems, fmt.Sprintf("%q ends in _ms but holds %v, not an integer of milliseconds", path, tok))
	}
	return nil
}
