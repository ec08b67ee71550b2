package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/console"
	"github.com/pgevents/pgevents/internal/store"
)

// hostile is what an event, an error or a host id may hold.
const (
	scriptPayload = `{"note": "<script>alert(1)</script>"}`
	imgHost       = `<img src=x onerror=alert(2)>`
	boldType      = `<b>bold</b>`
	scriptError   = `handler said <script>alert(3)</script>`
)

// TestPayloadsAndErrorsAreText: a payload, a host id, an event type, a
// dead letter's error and a halt's reason holding HTML are shown as text
// on every page that shows them, never as markup; and every page forbids
// inline scripts (Content-Security-Policy).
func TestPayloadsAndErrorsAreText(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, console.Options{})
	offs := e.appendTx(ev(imgHost, boldType, scriptPayload))
	e.subscribe("g")
	if err := store.Halt(e.ctx, e.pool, "g", 1, 0, offs[0], scriptError); err != nil {
		t.Fatal(err)
	}
	var dl int64
	if err := e.pool.QueryRow(e.ctx, `INSERT INTO dead_letter_queue (group_id, topic_id, partition_id, first_offset, last_offset,
		transaction_id, event_ids, host_ids, events, error, attempts, first_failed_at, last_failed_at)
		SELECT 'g', 1, 0, m.c_offset, m.c_offset, m.transaction_id, ARRAY[m.event_id], ARRAY[m.host_id], jsonb_build_array(to_jsonb(m)),
		       $1, 1, now(), now()
		FROM outbox_message_t m RETURNING id`, scriptError).Scan(&dl); err != nil {
		t.Fatal(err)
	}
	c := e.client()
	c.signIn(`<script>alert(4)</script>`, testToken)
	pages := []string{"/", "/topics/1/groups/g", "/topics/1/events", "/topics/1/events?host=" + url.QueryEscape(imgHost),
		fmt.Sprintf("/topics/1/partitions/0/offsets/%d", offs[0]), "/topics/1/hosts?host=" + url.QueryEscape(imgHost),
		"/dead-letters", fmt.Sprintf("/dead-letters/%d", dl), "/dead-letters?reason=" + url.QueryEscape("<script>")}
	for _, path := range pages {
		r := c.get(path)
		if r.status != http.StatusOK {
			t.Fatalf("GET %s: %d", path, r.status)
		}
		for _, raw := range []string{"<script>alert", "<img src=x", "<b>bold"} {
			if strings.Contains(r.body, raw) {
				t.Errorf("GET %s: %q is in the page as markup", path, raw)
			}
		}
		if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
			t.Errorf("GET %s: Content-Security-Policy %q", path, csp)
		}
	}
	// Shown, as text, where each belongs.
	for path, want := range map[string]string{
		fmt.Sprintf("/topics/1/partitions/0/offsets/%d", offs[0]): "&lt;script&gt;alert(1)&lt;/script&gt;",
		fmt.Sprintf("/dead-letters/%d", dl):                       "handler said &lt;script&gt;alert(3)&lt;/script&gt;",
		"/topics/1/groups/g":                                      "handler said &lt;script&gt;alert(3)&lt;/script&gt;",
		"/topics/1/events":                                        "&lt;img src=x onerror=alert(2)&gt;",
		"/":                                                       "signed in as &lt;script&gt;alert(4)&lt;/script&gt;",
	} {
		if body := c.mustGet(path); !strings.Contains(body, want) {
			t.Errorf("GET %s does not show %s as text", path, want)
		}
	}
}

// TestFiltersAreParameters: filters holding quotes, SQL, and LIKE's
// pattern characters find exactly what holds them literally, and harm
// nothing.
func TestFiltersAreParameters(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, console.Options{})
	e.appendTx(ev("o'brien", "t.a", `{}`), ev("o'brien", "t.a", `{}`))
	e.appendTx(ev("plain", "t.b", `{}`))
	e.appendTx(ev(`x' OR 'a'='a`, "50%", `{}`))
	for i, reason := range []string{"50% off", "plain failure", "under_score", `back\slash`} {
		e.exec(`INSERT INTO dead_letter_queue (group_id, topic_id, partition_id, first_offset, last_offset, transaction_id,
			event_ids, host_ids, events, error, attempts, first_failed_at, last_failed_at)
			VALUES ('g', 1, 0, $1, $1, 1, '{}', ARRAY[$2], '[{"event_type": "t.a"}]', $3, 1, now(), now())`,
			i+1, map[bool]string{true: "o'brien", false: "plain"}[i == 0], reason)
	}
	c := e.client()
	count := func(path, class string) int {
		t.Helper()
		return strings.Count(c.mustGet(path), `class="`+class+`"`)
	}
	for _, tt := range []struct {
		filter string
		want   int
	}{
		{"reason=" + url.QueryEscape("%"), 1},
		{"reason=" + url.QueryEscape("_"), 1},
		{"reason=" + url.QueryEscape(`\`), 1},
		{"reason=" + url.QueryEscape("FAILURE"), 1},
		{"reason=", 4},
		{"host=" + url.QueryEscape("o'brien"), 1},
		{"host=" + url.QueryEscape("' OR '1'='1"), 0},
		{"group=" + url.QueryEscape("g' --"), 0},
		{"group=g&type=t.a", 4},
		{"type=" + url.QueryEscape(`t.a"}]'; DROP TABLE dead_letter_queue; --`), 0},
		{"type=" + url.QueryEscape("%"), 0},
	} {
		if got := count("/dead-letters?"+tt.filter, "dl"); got != tt.want {
			t.Errorf("dead letters ?%s: %d rows, want %d", tt.filter, got, tt.want)
		}
	}
	for _, tt := range []struct {
		filter string
		want   int
	}{
		{"host=" + url.QueryEscape("o'brien"), 2},
		{"host=" + url.QueryEscape("x' OR 'a'='a"), 1},
		{"host=" + url.QueryEscape("' OR 1=1 --"), 0},
		{"type=" + url.QueryEscape("%"), 0},
		{"type=" + url.QueryEscape("50%"), 1},
		{"id=" + url.QueryEscape("' OR 1=1 --"), 0},
		{"host=" + url.QueryEscape("'; DROP TABLE outbox_message_t; --"), 0},
		{"partition=0&from=0&host=" + url.QueryEscape("o'brien"), 0},
	} {
		got := count("/topics/1/events?"+tt.filter, "ev")
		if strings.HasPrefix(tt.filter, "partition=0") {
			// o'brien's events are in one partition: 0 or 1.
			got += count("/topics/1/events?partition=1&from=0&host="+url.QueryEscape("o'brien"), "ev")
			tt.want = 2
		}
		if got != tt.want {
			t.Errorf("events ?%s: %d rows, want %d", tt.filter, got, tt.want)
		}
	}
	c.mustGet("/topics/1/hosts?host=" + url.QueryEscape("'; DROP TABLE outbox_message_t; --"))
	for _, bad := range []string{"/dead-letters?since=yesterday", "/topics/1/events?from=1%3BDROP", "/topics/1/events?partition=x"} {
		if r := c.get(bad); r.status != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400", bad, r.status)
		}
	}
	if n := e.queryInt(`SELECT (SELECT count(*) FROM dead_letter_queue) + (SELECT count(*) FROM outbox_message_t)`); n != 8 {
		t.Fatalf("%d rows in dead_letter_queue and outbox_message_t after the filters, want 8", n)
	}
}

// TestPasswordNeverShown: the database password (of the URL the console
// connects with) appears on no page, error pages included, nor in the log;
// the pages name the database by user, host and name.
func TestPasswordNeverShown(t *testing.T) {
	t.Parallel()
	const password = "Pw-9f3b-never-SHOWN"
	e := newEnv(t, 2, console.Options{}, func(pc *pgxpool.Config) { pc.ConnConfig.Password = password })
	dl := e.fixture()
	c := e.client()
	c.signIn("ada", testToken)
	pages := []string{"/", "/topics/1/groups/g", "/topics/1/events", "/topics/1/hosts?host=host-1", "/dead-letters",
		fmt.Sprintf("/dead-letters/%d", dl), "/replicas", "/audit", "/signin", "/topics/1/events?time=nonsense", "/nothing"}
	check := func(c *client, what string) {
		t.Helper()
		for _, p := range pages {
			body := c.get(p).body
			if strings.Contains(body, password) {
				t.Errorf("%s: GET %s shows the password", what, p)
			}
		}
	}
	check(c, "console")
	if body := c.mustGet("/"); !strings.Contains(body, "database "+e.cpool.Config().ConnConfig.User+"@") {
		t.Error("the pages do not name the database's user")
	}
	// Failing actions' messages, and a console whose database is down.
	c.post("/topics/1/groups/nobody/pause", nil, true)
	c.post("/topics/1/groups/g/reset", url.Values{"to": {"offset"}, "value": {"x"}}, true)
	down := newEnv(t, 1, console.Options{}, func(pc *pgxpool.Config) {
		pc.ConnConfig.Password = password
		pc.ConnConfig.Port = 1 // nothing listens there
	})
	dc := down.client()
	check(dc, "console without its database")
	if r := dc.get("/"); r.status != http.StatusInternalServerError {
		t.Errorf("GET / without the database: %d, want 500", r.status)
	}
	for _, logs := range []string{e.logs.String(), down.logs.String()} {
		if strings.Contains(logs, password) {
			t.Error("the log shows the password")
		}
	}
}
