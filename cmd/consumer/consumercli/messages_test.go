package consumercli

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

// TestUnknownNames: a group or topic the database does not know, given on
// the command line or in the file, is an error naming it (exit status 1),
// not an empty table or a table of dashes with status 0.
func TestUnknownNames(t *testing.T) {
	t.Parallel()
	url, _ := migrated(t, 4)
	cfg := writeConfig(t, recordingConfig(4, -1, 10))
	other := writeConfig(t, strings.Replace(recordingConfig(4, -1, 10), "groupId: g", "groupId: g\ntopicId: 9", 1))
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--group", "nosuch"}, `group "nosuch" has no subscription and no position on topic 1`},
		{[]string{"status", "--json", "--group", "nosuch"}, `group "nosuch"`},
		{[]string{"offsets", "show", "--group", "nosuch"}, `group "nosuch"`},
		{[]string{"dlq", "list", "--group", "nosuch"}, `group "nosuch"`},
		{[]string{"offsets", "show", "--topic", "9"}, "topic 9 does not exist"},
		{[]string{"status", "--config", other}, "topic 9 does not exist"},
		{[]string{"offsets", "show", "--config", other}, "topic 9 does not exist"},
		{[]string{"group", "pause", "nosuch"}, `group "nosuch" has no subscription on topic 1`},
		{[]string{"repartition", "--topic", "9", "--partitions", "2"}, "topic 9 does not exist"},
	} {
		args := tt.args
		if !strings.Contains(strings.Join(args, " "), "--config") {
			args = append(args, "--config", cfg)
		}
		code, out := runOnce(t, url, args...)
		if code == 0 || !strings.Contains(out, tt.want) {
			t.Errorf("consumer %s: exit %d, want non-zero saying %q\n%s", strings.Join(tt.args, " "), code, tt.want, out)
		}
	}
}

// TestMessagesSayWhatToDo: the errors a newcomer meets first name what is
// wrong and what to do: the command to run, the key to set, where a value
// came from.
func TestMessagesSayWhatToDo(t *testing.T) {
	t.Parallel()
	t.Run("before migrate", func(t *testing.T) {
		t.Parallel()
		url := pgtest.NewDB(t) // nothing installed
		cfg := writeConfig(t, recordingConfig(4, -1, 10))
		for _, args := range [][]string{{"run"}, {"status"}, {"dlq", "list"}, {"offsets", "show"}, {"group", "pause", "g"}, {"maintain", "--once"}} {
			code, out := runOnce(t, url, append(args, "--config", cfg)...)
			if code != 1 || !strings.Contains(out, "pgevents is not installed") || !strings.Contains(out, "consumer migrate --config "+cfg) ||
				strings.Contains(out, "SQLSTATE") {
				t.Errorf("consumer %s before migrate: exit %d, want 1 saying to run consumer migrate\n%s", strings.Join(args, " "), code, out)
			}
		}
	})
	t.Run("schema typo", func(t *testing.T) {
		t.Parallel()
		url, _ := migrated(t, 4)
		cfg := writeConfig(t, "schema: pgevnts\n"+recordingConfig(4, -1, 10))
		for _, args := range [][]string{{"run"}, {"status"}, {"dlq", "list"}} {
			code, out := runOnce(t, url, append(args, "--config", cfg)...)
			if code != 1 || !strings.Contains(out, `schema "pgevnts" (the file's schema key) does not exist`) || !strings.Contains(out, "consumer migrate") {
				t.Errorf("consumer %s with a schema that does not exist: exit %d\n%s", strings.Join(args, " "), code, out)
			}
		}
	})
	t.Run("migrate beside seed tables", func(t *testing.T) {
		t.Parallel()
		url := pgtest.NewDB(t)
		eventtest.Exec(t, pgtest.Pool(t, url), pgtest.SeedTables)
		cfg := writeConfig(t, recordingConfig(4, -1, 10))
		code, out := runOnce(t, url, "migrate", "--config", cfg)
		if code != 2 || !strings.Contains(out, "schema:") || !strings.Contains(out, "consumer adopt") || !strings.Contains(out, `"log_counter" already exists`) {
			t.Errorf("migrate into a seed-style database: exit %d, want 2 naming the schema key and consumer adopt\n%s", code, out)
		}
		cfg = writeConfig(t, "schema: pgevents\n"+recordingConfig(4, -1, 10))
		if code, out := runOnce(t, url, "migrate", "--config", cfg); code != 0 {
			t.Errorf("migrate with schema: pgevents beside the seed tables: exit %d\n%s", code, out)
		}
	})
	t.Run("wrong database URL", func(t *testing.T) {
		t.Parallel()
		// A port nobody listens on, and one whose listener hangs up at
		// once (pgx tries TLS first there and reports both attempts).
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		closed, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		closedAddr := closed.Addr().String()
		closed.Close()
		for _, addr := range []string{closedAddr, ln.Addr().String()} {
			bad := fmt.Sprintf("postgres://app:s3cr3t-pw@%s/appdb", addr)
			cfg := writeConfig(t, recordingConfig(4, -1, 10))
			fromFile := writeConfig(t, "databaseUrl: "+bad+"\n"+recordingConfig(4, -1, 10))
			for _, tt := range []struct {
				url, cfg, from string
				args           []string
			}{
				{bad, cfg, "from DATABASE_URL", []string{"status"}},
				{bad, cfg, "from DATABASE_URL", []string{"migrate"}},
				{bad, cfg, "from DATABASE_URL", []string{"run"}},
				{"", fromFile, "from databaseUrl in " + fromFile, []string{"status"}},
				{"", fromFile, "from databaseUrl in " + fromFile, []string{"migrate"}},
			} {
				code, out := runOnce(t, tt.url, append(tt.args, "--config", tt.cfg)...)
				lines := strings.Split(strings.TrimSpace(out), "\n")
				if code != 1 || len(lines) != 1 || !strings.Contains(out, "app@"+addr+"/appdb") || !strings.Contains(out, tt.from) ||
					strings.Contains(out, "s3cr3t") || strings.Contains(out, "tls error") {
					t.Errorf("consumer %s with %s unreachable (%s): exit %d, want 1 and one line naming the database and %q, without the password or a TLS error\n%s",
						tt.args[0], addr, tt.from, code, tt.from, out)
				}
				if addr == closedAddr && strings.Count(out, "connection refused") != 1 {
					t.Errorf("consumer %s: says \"connection refused\" %d times, want once\n%s", tt.args[0], strings.Count(out, "connection refused"), out)
				}
			}
		}
	})
	t.Run("dlq of a missing id", func(t *testing.T) {
		t.Parallel()
		url, _ := migrated(t, 4)
		cfg := writeConfig(t, recordingConfig(4, -1, 10))
		for _, sub := range []string{"discard", "replay"} {
			code, out := runOnce(t, url, "dlq", sub, "1", "--config", cfg)
			if code != 1 || strings.TrimSpace(out) != "consumer: dead letter 1 does not exist (`consumer dlq list` lists them)" {
				t.Errorf("dlq %s 1 of a missing dead letter: exit %d\n%s", sub, code, out)
			}
		}
	})
}
