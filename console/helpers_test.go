package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/console"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testToken is the console's token in tests.
const testToken = "test-token-0123456789"

// env is a console on a fresh database holding topic 1.
type env struct {
	t     *testing.T
	ctx   context.Context // names the test schema
	pool  *pgxpool.Pool   // the test's own statements
	url   string          // the database, for consumers
	cpool *pgxpool.Pool   // the console's
	con   *console.Console
	srv   *httptest.Server
	logs  *logtest.Buffer
	token string
}

// newEnv starts a console (opts, with the schema, logger and, unless
// read-only, token filled in) on a database with topic 1 of partitions
// partitions. edit, when given, adjusts the console's pool configuration.
func newEnv(t *testing.T, partitions int, opts console.Options, edit ...func(*pgxpool.Config)) *env {
	t.Helper()
	pool := pgtest.TopicPool(t, partitions)
	e := &env{t: t, ctx: pgtest.Context(context.Background()), pool: pool, url: pool.Config().ConnString(),
		logs: logtest.New(t)}
	// The console's pool as the binary makes it (jit off: see console.New).
	pc, err := pgevents.ParsePoolConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range edit {
		f(pc)
	}
	cpool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cpool.Close)
	e.cpool = cpool
	e.restart(opts)
	return e
}

// restart replaces the console with one of opts (the schema, the logger
// and, unless read-only, the token filled in), on the same pool.
func (e *env) restart(opts console.Options) {
	e.t.Helper()
	log := zerolog.New(e.logs)
	opts.Logger = &log
	opts.Schema = pgtest.Schema()
	if !opts.ReadOnly && opts.Token == "" {
		opts.Token = testToken
	}
	e.token = opts.Token
	var err error
	if e.con, err = console.New(e.cpool, opts); err != nil {
		e.t.Fatal(err)
	}
	e.srv = httptest.NewServer(e.con)
	e.t.Cleanup(e.srv.Close)
}

// appendTx appends evs in one transaction and returns their offsets.
func (e *env) appendTx(evs ...pgevents.Event) []int64 {
	e.t.Helper()
	var offs []int64
	err := pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		var err error
		offs, err = pgevents.Append(e.ctx, tx, evs...)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return offs
}

func ev(host, typ, payload string) pgevents.Event {
	return pgevents.Event{HostID: host, UserID: "u", EventType: typ, Payload: []byte(payload)}
}

// subscribe registers group on topic 1 at its earliest events, as a
// consumer's first start does, without running one.
func (e *env) subscribe(group string) {
	e.t.Helper()
	if _, _, err := store.Subscribe(e.ctx, e.pool, group, 1, store.Start{Kind: "earliest"}, time.Minute); err != nil {
		e.t.Fatal(err)
	}
}

// setPosition moves group's position in partition p (consumer_offsets is
// writable, as an operator's script would write it).
func (e *env) setPosition(group string, p int, next int64) {
	e.t.Helper()
	e.exec(`UPDATE consumer_offsets SET next_offset = $3 WHERE group_id = $1 AND topic_id = 1 AND partition_id = $2`, group, p, next)
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	eventtest.Exec(e.t, e.pool, sql, args...)
}

// sample writes a sample of topic 1 now, as maintenance does, in a period
// of its own (periods of 1 ms: it tries again in the rare case that the
// previous sample's period is not over), and returns it.
func (e *env) sample() store.Sampled {
	e.t.Helper()
	for range 100 {
		s, err := store.Sample(e.ctx, e.pool, 1, time.Millisecond)
		if err != nil {
			e.t.Fatal(err)
		}
		if s.Wrote {
			return s
		}
		time.Sleep(time.Millisecond)
	}
	e.t.Fatal("no sample written in 100 periods of 1 ms")
	return store.Sampled{}
}

// execOn runs sql on the session c.
func (e *env) execOn(c *pgx.Conn, sql string, args ...any) {
	e.t.Helper()
	if _, err := c.Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *env) queryInt(sql string, args ...any) int64 {
	e.t.Helper()
	return eventtest.QueryInt(e.t, e.pool, sql, args...)
}

// positions returns group's positions, partition by partition.
func (e *env) positions(group string) map[int]int64 {
	e.t.Helper()
	rows, err := e.pool.Query(e.ctx, `SELECT partition_id, next_offset FROM consumer_offsets WHERE group_id = $1 AND topic_id = 1`, group)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int]int64{}
	var (
		p int
		n int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&p, &n}, func() error { out[p] = n; return nil }); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// dbState is everything an action could change, as text: positions (with
// the newest row of each, which a reset to the same offset inserts anew),
// subscriptions, leases, halts, dead letters, parked events and hosts, and
// the audit rows.
func (e *env) dbState() string {
	e.t.Helper()
	var s string
	err := e.pool.QueryRow(e.ctx, `SELECT concat_ws(E'\n',
  (SELECT string_agg(format('%s/%s/%s=%s#%s', group_id, topic_id, partition_id, next_offset, seq), ',' ORDER BY group_id, partition_id, seq)
     FROM consumer_positions),
  (SELECT string_agg(format('%s/%s=%s', group_id, topic_id, state), ',' ORDER BY group_id) FROM subscriptions),
  (SELECT string_agg(format('%s/%s/%s:%s@%s', group_id, topic_id, partition_id, owner, epoch), ',' ORDER BY group_id, partition_id)
     FROM partition_leases),
  (SELECT string_agg(format('%s/%s/%s@%s', group_id, topic_id, partition_id, c_offset), ',' ORDER BY group_id, partition_id)
     FROM partition_halts),
  (SELECT string_agg(format('%s:%s:%s', id, attempts, error), ',' ORDER BY id) FROM dead_letter_queue),
  (SELECT string_agg(id::text, ',' ORDER BY id) FROM parked_events),
  (SELECT string_agg(host_id, ',' ORDER BY host_id) FROM parked_hosts),
  (SELECT 'audit ' || count(*) FROM console_audit))`).Scan(&s)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// client is a browser (or a script) talking to the console: it keeps
// cookies and does not follow redirects.
type client struct {
	t    *testing.T
	base string
	hc   *http.Client
	csrf string
}

func (e *env) client() *client {
	return newClient(e.t, e.srv.URL, e.srv.Client())
}

func newClient(t *testing.T, base string, hc *http.Client) *client {
	jar, _ := cookiejar.New(nil)
	c := *hc
	c.Jar = jar
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &client{t: t, base: base, hc: &c}
}

// response is what the console answered.
type response struct {
	status int
	body   string
	header http.Header
}

func (c *client) do(method, path string, form url.Values, header map[string]string) response {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return response{status: res.StatusCode, body: string(b), header: res.Header}
}

func (c *client) get(path string) response {
	c.t.Helper()
	return c.do(http.MethodGet, path, nil, nil)
}

// mustGet gets path and fails the test unless it answers 200.
func (c *client) mustGet(path string) string {
	c.t.Helper()
	r := c.get(path)
	if r.status != http.StatusOK {
		c.t.Fatalf("GET %s: %d\n%s", path, r.status, r.body)
	}
	return r.body
}

// post sends form (with the session's CSRF token unless form has one or
// csrf is false).
func (c *client) post(path string, form url.Values, csrf bool) response {
	c.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	if csrf && form.Get("csrf") == "" {
		form.Set("csrf", c.csrf)
	}
	return c.do(http.MethodPost, path, form, nil)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// signIn signs in as name with token and keeps the session's CSRF token.
func (c *client) signIn(name, token string) {
	c.t.Helper()
	r := c.do(http.MethodPost, "/signin", url.Values{"name": {name}, "token": {token}}, nil)
	if r.status != http.StatusSeeOther {
		c.t.Fatalf("sign-in: %d\n%s", r.status, r.body)
	}
	m := csrfField.FindStringSubmatch(c.mustGet("/"))
	if m == nil {
		c.t.Fatal("signed in, but the page has no CSRF field")
	}
	c.csrf = m[1]
}

// find returns the first submatch of re in s, failing the test without.
func find(t *testing.T, s, re string) string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no match for %s in\n%s", re, s)
	}
	return m[1]
}

// waitFor polls cond until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	pgtest.WaitFor(t, 15*time.Second, what, cond)
}

func fmtMap(m map[int]int64) string { return fmt.Sprint(m) }
