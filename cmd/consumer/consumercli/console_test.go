package consumercli

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/store"
)

const consoleTestToken = "cli-console-token-0123"

// waitURL waits for the process to print the console's address.
func waitURL(t *testing.T, p *proc, re string) string {
	t.Helper()
	var u string
	pgtest.WaitFor(t, 30*time.Second, "the console's address", func() bool {
		if m := regexp.MustCompile(re).FindStringSubmatch(p.out.String()); m != nil {
			u = m[1]
		}
		return u != ""
	})
	return u
}

func httpDo(t *testing.T, method, u, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestConsoleCommand: `consumer console` exits 2 naming console.listen
// without a console section, and console.token without a token; with
// them, it serves the pages (without the URL's password) and acts with
// the token, which PGEVENTS_CONSOLE_TOKEN gives; SIGTERM stops it, exit 0.
func TestConsoleCommand(t *testing.T) {
	t.Setenv(config.EnvConsoleToken, "")
	dbURL, pool := migrated(t, 2)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	const password = "Cli-pw-never-on-a-page"
	u.User = url.UserPassword(u.User.Username(), password) // the test server trusts; the password is only carried
	ctx := pgtest.Context(context.Background())
	if _, _, err := store.Subscribe(ctx, pool, "g", 1, store.Start{Kind: "earliest"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	base := recordingConfig(2, -1, 10)
	for _, tt := range []struct{ file, key string }{
		{base, "console.listen"},
		{base + "console: {listen: '127.0.0.1:0'}\n", "console.token"},
	} {
		if code, out := runOnce(t, u.String(), "console", "--config", writeConfig(t, tt.file)); code != 2 || !strings.Contains(out, tt.key) {
			t.Errorf("consumer console: exit %d, want 2 naming %s\n%s", code, tt.key, out)
		}
	}

	t.Setenv(config.EnvConsoleToken, consoleTestToken)
	p := start(t, u.String(), "console", "--config", writeConfig(t, base+"console: {listen: '127.0.0.1:0'}\n"))
	addr := waitURL(t, p, `console: (http://\S+/)`)
	status, body := httpDo(t, http.MethodGet, addr, "")
	if status != http.StatusOK || !strings.Contains(body, `data-group="g"`) {
		t.Fatalf("GET %s: %d\n%s", addr, status, body)
	}
	if strings.Contains(body, password) || strings.Contains(p.out.String(), password) {
		t.Fatal("the console shows the database password")
	}
	if status, body := httpDo(t, http.MethodPost, addr+"topics/1/groups/g/pause", "wrong-token-0123456789"); status != http.StatusUnauthorized {
		t.Fatalf("pause with a wrong token: %d\n%s", status, body)
	}
	if status, body := httpDo(t, http.MethodPost, addr+"topics/1/groups/g/pause", consoleTestToken); status != http.StatusOK {
		t.Fatalf("pause with the token: %d\n%s", status, body)
	}
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM subscriptions WHERE group_id = 'g' AND state = 'PAUSED'`); n != 1 {
		t.Fatal("the console's pause did not pause the group")
	}
	if code := p.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("consumer console exited %d after SIGTERM", code)
	}
}

// TestRunServesConsole: `consumer run` with a console section serves the
// console beside the consumers, which it shows owning their partitions.
// The section names its address with the old key, console.addr: it is
// read, and a warning at start names the key and its line.
func TestRunServesConsole(t *testing.T) {
	t.Parallel()
	dbURL, _ := migrated(t, 2)
	cfg := strings.Replace(recordingConfig(2, -1, 10), "logLevel: warn", "logLevel: info", 1) +
		"console: {addr: '127.0.0.1:0', token: " + consoleTestToken + "}\n"
	p := start(t, dbURL, "run", "--config", writeConfig(t, cfg))
	addr := waitURL(t, p, `"addr":"(127\.0\.0\.1:\d+)"[^\n]*"message":"console listening"`)
	pgtest.WaitFor(t, 20*time.Second, "the group page shows both partitions owned", func() bool {
		status, body := httpDo(t, http.MethodGet, "http://"+addr+"/topics/1/groups/g", "")
		return status == http.StatusOK && strings.Count(body, `<span class="good">live</span>`) == 2
	})
	if code := p.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("consumer run exited %d after SIGTERM", code)
	}
	line := strings.Count(cfg, "\n") // the console section is the file's last line
	if out := p.out.String(); !regexp.MustCompile(`"level":"warn"[^\n]*"key":"console.addr","line":` + strconv.Itoa(line) + `[^\n]*is deprecated: name it console.listen`).MatchString(out) {
		t.Errorf("no warning naming console.addr (line %d) at start:\n%s", line, out)
	}
}

// TestDemoServesConsole: `consumer demo` serves the console while it runs
// and prints its address and a token.
func TestDemoServesConsole(t *testing.T) {
	t.Parallel()
	p := start(t, pgtest.NewDB(t), "demo", "--dir", t.TempDir(), "--duration", "4s", "--rate", "200")
	addr := waitURL(t, p, `console: (http://\S+/) \(sign in with token [0-9a-f]{32} `)
	// The console serves from the start; the group shows once its
	// consumer subscribed.
	pgtest.WaitFor(t, 20*time.Second, "the demo's group on the console", func() bool {
		status, body := httpDo(t, http.MethodGet, addr, "")
		return status == http.StatusOK && strings.Contains(body, `data-group="demo"`)
	})
	select {
	case code := <-p.exitCh:
		if code != 0 || !strings.Contains(p.out.String(), "done:") {
			t.Fatalf("demo: exit %d", code)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the demo did not finish")
	}
}
