package listener

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/internal/backoff"
	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

// logLine is what the tests read of a JSON log line.
type logLine struct {
	Level    string `json:"level"`
	Message  string `json:"message"`
	Error    string `json:"error"`
	Repeated int    `json:"repeated"`
	From     string `json:"from"`
	To       string `json:"to"`
}

// logLines returns the JSON lines written to b so far.
func logLines(t *testing.T, b *logtest.Buffer) []logLine {
	t.Helper()
	var lines []logLine
	for _, s := range strings.Split(b.String(), "\n") {
		if s == "" {
			continue
		}
		var l logLine
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("log line %q: %v", s, err)
		}
		lines = append(lines, l)
	}
	return lines
}

// lostLines returns the warnings of a lost listening session among lines.
func lostLines(lines []logLine) []logLine {
	var lost []logLine
	for _, l := range lines {
		if l.Level == "warn" && l.Message == msgLost {
			lost = append(lost, l)
		}
	}
	return lost
}

// TestListenerBacksOffWhenSessionDies: the server ends the listening
// session every 20 ms for 10 s (an operator's script gone wrong, a pooler
// that recycles sessions). Each session then dies right after its LISTEN,
// and the listener backs off (100 ms doubling to 5 s, jittered): a few
// reconnects in the window, not one per kill, and the loss is logged as a
// warning once per interval, the repeats counted (the next line's
// "repeated"), not once per reconnect. After the kills stop, the listener
// connects again and delivers. (Before the fix, every end of the session
// was taken for a channel change: 139 reconnects and 288 info lines in the
// window, no warning.)
func TestListenerBacksOffWhenSessionDies(t *testing.T) {
	t.Parallel()
	logs := logtest.New(t)
	e := startEnv(t, envOptions{tweak: func(c *Config) {
		l := zerolog.New(logs).Level(zerolog.InfoLevel)
		c.Logger = &l
	}})
	e.sink.awaitNotifies(t, 10*time.Second, e.appendEvents(t, "before"))

	const window = 10 * time.Second
	before := e.l.Connects()
	pids := map[int64]bool{}
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	for time.Since(start) < window {
		// In the select list, not in WHERE: the planner may order the
		// quals, and terminate every backend of the cluster.
		rows, err := e.pool.Query(t.Context(), `
			SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity
			 WHERE application_name = $1 AND datname = current_database()`, ApplicationName)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var pid int64
			var ok bool
			if err := rows.Scan(&pid, &ok); err != nil {
				t.Fatal(err)
			}
			pids[pid] = true
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		<-tick.C
	}
	tick.Stop()
	reconnects := e.l.Connects() - before
	lines := logLines(t, logs)
	lost := lostLines(lines)
	t.Logf("in %s: %d reconnects, %d backends terminated, %d log lines, %d warnings of a lost session",
		window, reconnects, len(pids), len(lines), len(lost))

	// The back-off's waits add up to 10 s after 6 to 9 quick deaths
	// (jitter); a listener that reconnects at once makes one per kill,
	// hundreds.
	if reconnects > 12 {
		t.Errorf("%d reconnects in %s of sessions ended every 20 ms, want at most 12 (backing off)", reconnects, window)
	}
	if len(pids) < 2 {
		t.Errorf("%d listening backends terminated, want several", len(pids))
	}
	if len(lost) < 1 || len(lost) > 3 {
		t.Errorf("%d warnings %q in %s, want 1 to 3 (one per interval):\n%s", len(lost), msgLost, window, logs.String())
	}
	for _, l := range lost {
		if l.Error == "" {
			t.Errorf("warning of a lost session without its error: %+v", l)
		}
	}
	if n := len(lines); n > 10 {
		t.Errorf("%d log lines in %s, want at most 10:\n%s", n, window, logs.String())
	}

	// The kills stopped: the listener connects again and delivers.
	pgtest.WaitFor(t, 15*time.Second, "the listener connected again", e.l.Ready)
	e.sink.awaitNotifies(t, 10*time.Second, e.appendEvents(t, hosts("after", 8)...))

	// The interval since the first warning has passed: the next loss is
	// logged, with the count of the losses held back meanwhile.
	pgtest.WaitFor(t, time.Until(start.Add(backoff.DefaultInterval))+time.Second, "the interval of the first warning", func() bool {
		return time.Since(start) >= backoff.DefaultInterval
	})
	connects := e.l.Connects()
	e.terminateListener(t)
	pgtest.WaitFor(t, 10*time.Second, "a warning of a lost session with a repeated count", func() bool {
		for _, l := range lostLines(logLines(t, logs)) {
			if l.Repeated > 0 {
				return true
			}
		}
		return false
	})
	pgtest.WaitFor(t, 15*time.Second, "the listener connected again", func() bool { return e.l.Connects() > connects && e.l.Ready() })
	e.sink.awaitNotifies(t, 10*time.Second, e.appendEvents(t, hosts("last", 8)...))
}

// TestListenerSetChannelIsNotALoss: SetChannel ends the listening session
// to LISTEN on the new channel; that is not a loss. Moving eight times in
// a row connects again at once each time (the quick-death back-off would
// take 8 s or more in all), logs each move at info level and no
// warning, and notifications on the new channel are delivered while the
// old one is no longer listened on.
func TestListenerSetChannelIsNotALoss(t *testing.T) {
	t.Parallel()
	logs := logtest.New(t)
	e := startEnv(t, envOptions{tweak: func(c *Config) {
		l := zerolog.New(logs).Level(zerolog.InfoLevel)
		c.Logger = &l
	}})
	const moves = 8
	start := time.Now()
	prev := e.l.Channel()
	for i := range moves {
		ch := "moved_" + string(rune('a'+i))
		connects := e.l.Connects()
		e.l.SetChannel(ch)
		if got := e.l.Channel(); got != ch {
			t.Fatalf("Channel() = %q after SetChannel(%q)", got, ch)
		}
		pgtest.WaitFor(t, 5*time.Second, "the listener listening on "+ch, func() bool {
			return e.l.Connects() > connects && e.l.Ready()
		})
		// The old channel no longer wakes; the new one does (in order: the
		// old channel's notification, were it heard, would come first).
		if _, err := e.pool.Exec(t.Context(), "SELECT pg_notify($1, '2:*'), pg_notify($2, '1:*')", prev, ch); err != nil {
			t.Fatal(err)
		}
		e.sink.awaitNotifies(t, 10*time.Second, []notifyCall{{1, -1, 0}})
		got, _ := e.sink.snapshot()
		for _, c := range got {
			if c.Topic == 2 {
				t.Fatalf("a notification on the old channel %q was delivered after the move to %q", prev, ch)
			}
		}
		e.sink.mu.Lock()
		e.sink.notifies = nil
		e.sink.mu.Unlock()
		prev = ch
	}
	// The quick-death back-off would wait at least 8 s in all (its jittered
	// lower bounds: 50 ms, 100 ms, ... 2.5 s); eight moves take a few
	// hundred milliseconds.
	took := time.Since(start)
	t.Logf("%d moves in %s", moves, took)
	if took > 6*time.Second {
		t.Errorf("%d moves took %s, want well under 6 s (no back-off)", moves, took)
	}
	lines := logLines(t, logs)
	moved := 0
	for _, l := range lines {
		switch {
		case l.Level == "warn" || l.Level == "error":
			t.Errorf("a channel change logged %s %q", l.Level, l.Message)
		case l.Message == "listener: listening on the topic's new channel":
			moved++
			if l.From == l.To {
				t.Errorf("move logged from %q to the same channel", l.From)
			}
		}
	}
	if moved != moves {
		t.Errorf("%d moves logged, want %d:\n%s", moved, moves, logs.String())
	}
}
