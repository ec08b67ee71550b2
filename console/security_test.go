package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/console"
	"github.com/pgevents/pgevents/internal/pgtest"
)

// resolverFor returns Options.Resolvers that replays group g's dead
// letters with a consumer (never run) whose handler succeeds.
func resolverFor(t *testing.T, e *env, partitions int) func(string, int) console.Resolver {
	t.Helper()
	hs := &pgevents.Handlers{}
	hs.HandleAll(pgevents.HandlerFunc(func(context.Context, pgx.Tx, *pgevents.Event) error { return nil }))
	c, err := pgevents.NewConsumer(e.pool, pgevents.Config{GroupID: "g", TotalPartitions: partitions, Handlers: hs, Schema: pgtest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	return func(group string, topic int) console.Resolver {
		if group == "g" && topic == 1 {
			return c
		}
		return nil
	}
}

// actionRequest is one action the console serves, with a form that would
// change the database if the request were let through.
type actionRequest struct {
	path string
	form url.Values
}

func allActions(dl int64) []actionRequest {
	id := strconv.FormatInt(dl, 10)
	return []actionRequest{
		{"/topics/1/groups/g/pause", url.Values{}},
		{"/topics/1/groups/h/resume", url.Values{}},
		{"/topics/1/groups/g/unhalt", url.Values{"partition": {"0"}}},
		{"/topics/1/groups/g/reset", url.Values{"to": {"latest"}, "force": {"1"}, "confirm": {"1"}}},
		{"/dead-letters/replay", url.Values{"id": {id}}},
		{"/dead-letters/discard", url.Values{"id": {id}}},
		{"/signout", url.Values{}},
	}
}

func clone(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}

// TestActionsRequireTheTokenAndCSRF: every action refuses, and changes
// nothing in the database, a request without credentials or with a wrong
// bearer token (401), and a browser session's request without its own
// CSRF token or from another site (403). The same requests with the
// credentials go through (the refusals are the guards', not a broken
// form's). The wrong tokens of each action come from a client address of
// their own (X-Forwarded-For through a trusted proxy), below the limit
// of failures per address.
func TestActionsRequireTheTokenAndCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, console.Options{})
	dl := e.fixture()
	e.restart(console.Options{Resolvers: resolverFor(t, e, 2), TrustedProxies: []string{"127.0.0.1", "::1"}})
	anon, op, other := e.client(), e.client(), e.client()
	op.signIn("ada", testToken)
	other.signIn("eve", testToken)
	if op.csrf == other.csrf {
		t.Fatal("two sessions share a CSRF token")
	}
	before := e.dbState()
	for i, a := range allActions(dl) {
		try := func(what string, want int, c *client, form url.Values, header map[string]string) {
			t.Helper()
			h := map[string]string{"X-Forwarded-For": fmt.Sprintf("198.51.100.%d", i+1)}
			for k, v := range header {
				h[k] = v
			}
			r := c.do(http.MethodPost, a.path, form, h)
			if r.status != want {
				t.Errorf("POST %s %s: %d, want %d\n%s", a.path, what, r.status, want, r.body)
			}
		}
		try("without credentials", http.StatusUnauthorized, anon, clone(a.form), nil)
		try("with a wrong bearer token", http.StatusUnauthorized, anon, clone(a.form), map[string]string{"Authorization": "Bearer wrong-token-0123456789"})
		try("with the token as Basic", http.StatusUnauthorized, anon, clone(a.form), map[string]string{"Authorization": "Basic " + testToken})
		try("with an empty bearer token", http.StatusUnauthorized, anon, clone(a.form), map[string]string{"Authorization": "Bearer "})
		try("with a session and no CSRF token", http.StatusForbidden, op, clone(a.form), nil)
		f := clone(a.form)
		f.Set("csrf", other.csrf)
		try("with another session's CSRF token", http.StatusForbidden, op, f, nil)
		f = clone(a.form)
		f.Set("csrf", op.csrf)
		try("from another origin", http.StatusForbidden, op, f, map[string]string{"Origin": "http://evil.example"})
		try("from another site", http.StatusForbidden, op, f, map[string]string{"Sec-Fetch-Site": "cross-site"})
		f.Set("csrf", op.csrf+"x")
		try("with a wrong CSRF token", http.StatusForbidden, op, f, nil)
	}
	if after := e.dbState(); after != before {
		t.Fatalf("refused requests changed the database:\nbefore %s\nafter  %s", before, after)
	}
	if !strings.Contains(e.logs.String(), "action refused") {
		t.Error("refusals are not logged")
	}

	// The same requests, with credentials, act.
	if r := op.post("/topics/1/groups/g/pause", nil, true); r.status != http.StatusSeeOther {
		t.Fatalf("pause with the session and its CSRF token: %d\n%s", r.status, r.body)
	}
	r := anon.do(http.MethodPost, "/topics/1/groups/h/resume", url.Values{}, map[string]string{"Authorization": "Bearer " + testToken})
	if r.status != http.StatusOK {
		t.Fatalf("resume with the bearer token: %d\n%s", r.status, r.body)
	}
	if s := e.dbState(); !strings.Contains(s, "g/1=PAUSED") || !strings.Contains(s, "h/1=ACTIVE") {
		t.Fatalf("the actions with credentials did not act: %s", s)
	}
}

// TestReadOnly: a read-only console's pages carry no form that posts (no
// action, no sign-in, no CSRF token), and it refuses every action request,
// the token's included, with 403, changing nothing.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, console.Options{ReadOnly: true})
	dl := e.fixture()
	before := e.dbState()
	c := e.client()
	for _, path := range []string{"/", "/topics/1/groups/g", "/topics/1/groups/h", "/topics/1/events", "/topics/1/hosts?host=host-2",
		"/dead-letters", fmt.Sprintf("/dead-letters/%d", dl), "/replicas", "/audit", "/signin"} {
		body := strings.ToLower(c.mustGet(path))
		for _, bad := range []string{`method="post"`, `name="csrf"`, "sign in to act", `name="token"`} {
			if strings.Contains(body, bad) {
				t.Errorf("read-only GET %s has %s", path, bad)
			}
		}
		if !strings.Contains(body, `id="read-only"`) {
			t.Errorf("read-only GET %s does not say it is read-only", path)
		}
	}
	bearer := map[string]string{"Authorization": "Bearer " + testToken}
	for _, a := range append(allActions(dl), actionRequest{"/signin", url.Values{"token": {testToken}}}) {
		for _, h := range []map[string]string{nil, bearer} {
			r := c.do(http.MethodPost, a.path, clone(a.form), h)
			if r.status != http.StatusForbidden {
				t.Errorf("read-only POST %s: %d, want 403", a.path, r.status)
			}
			if r.header.Get("Set-Cookie") != "" {
				t.Errorf("read-only POST %s set a cookie", a.path)
			}
		}
	}
	if after := e.dbState(); after != before {
		t.Fatalf("a read-only console changed the database:\nbefore %s\nafter  %s", before, after)
	}
}

// TestSignIn: a wrong token sets no cookie; the right one sets an
// HttpOnly, SameSite=Strict session cookie, Secure over TLS only; failures
// are limited per client; sign-out ends the session. A console has no
// default token.
func TestSignIn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, console.Options{})
	c := e.client()
	r := c.do(http.MethodPost, "/signin", url.Values{"token": {"not-the-token-at-all"}}, nil)
	if r.status != http.StatusUnauthorized || r.header.Get("Set-Cookie") != "" {
		t.Fatalf("wrong token: %d, Set-Cookie %q", r.status, r.header.Get("Set-Cookie"))
	}
	r = c.do(http.MethodPost, "/signin", url.Values{"token": {testToken}, "name": {"ada"}}, nil)
	ck := r.header.Get("Set-Cookie")
	if r.status != http.StatusSeeOther || !strings.Contains(ck, "HttpOnly") || !strings.Contains(ck, "SameSite=Strict") || strings.Contains(ck, "Secure") {
		t.Fatalf("sign-in over plain HTTP: %d, Set-Cookie %q; want HttpOnly, SameSite=Strict, not Secure", r.status, ck)
	}
	if !strings.Contains(c.mustGet("/"), "signed in as ada") {
		t.Fatal("the session does not show who is signed in")
	}

	tlsSrv := httptest.NewTLSServer(e.con)
	t.Cleanup(tlsSrv.Close)
	tc := newClient(t, tlsSrv.URL, tlsSrv.Client())
	r = tc.do(http.MethodPost, "/signin", url.Values{"token": {testToken}}, nil)
	if ck := r.header.Get("Set-Cookie"); r.status != http.StatusSeeOther || !strings.Contains(ck, "Secure") || !strings.Contains(ck, "HttpOnly") {
		t.Fatalf("sign-in over TLS: %d, Set-Cookie %q; want Secure", r.status, ck)
	}

	r = e.client().do(http.MethodPost, "/signin", url.Values{"token": {testToken}}, map[string]string{"X-Forwarded-Proto": "https"})
	if ck := r.header.Get("Set-Cookie"); !strings.Contains(ck, "Secure") {
		t.Fatalf("sign-in behind a TLS proxy: Set-Cookie %q; want Secure", ck)
	}

	// Sign-out ends the session: its cookie, kept by a thief, no longer
	// acts.
	c.signIn("ada", testToken)
	base, _ := url.Parse(e.srv.URL)
	stolen := c.hc.Jar.Cookies(base)
	if r := c.post("/signout", nil, true); r.status != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", r.status)
	}
	thief := e.client()
	thief.hc.Jar.SetCookies(base, stolen)
	thief.csrf = c.csrf
	if r := thief.post("/topics/1/groups/g/pause", nil, true); r.status != http.StatusUnauthorized {
		t.Fatalf("an action with the cookie of a session signed out: %d, want 401", r.status)
	}

	// Five failures from one address, and even the right token waits.
	b := e.client()
	for range 4 {
		b.do(http.MethodPost, "/signin", url.Values{"token": {"guess-guess-guess-guess"}}, nil)
	}
	if r := b.do(http.MethodPost, "/signin", url.Values{"token": {testToken}}, nil); r.status != http.StatusTooManyRequests || r.header.Get("Set-Cookie") != "" {
		t.Fatalf("the right token after five failures: %d (Set-Cookie %q), want 429 and no session", r.status, r.header.Get("Set-Cookie"))
	}

	for _, o := range []console.Options{{}, {Token: "short"}, {Token: "               "[:15]}} {
		if _, err := console.New(e.pool, o); err == nil {
			t.Errorf("console.New with token %q: no error; there is no default token", o.Token)
		}
	}
	if _, err := console.New(e.pool, console.Options{ReadOnly: true}); err != nil {
		t.Errorf("a read-only console needs no token: %v", err)
	}
}

// TestWrongBearerTokensCount: a wrong token in an action's Authorization
// header counts as a failed sign-in does: after five from one address,
// that address gets 429, the right token included, in the form and in
// the header; another address still acts. A session cookie that names no
// session is refused with 401 but does not count.
func TestWrongBearerTokensCount(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, console.Options{})
	e.subscribe("g")
	base, _ := url.Parse(e.srv.URL)
	stale := e.client()
	stale.hc.Jar.SetCookies(base, []*http.Cookie{{Name: "pgevents_console", Value: "no-such-session"}})
	for range 6 {
		if r := stale.post("/topics/1/groups/g/pause", nil, false); r.status != http.StatusUnauthorized {
			t.Fatalf("a cookie of no session: %d, want 401", r.status)
		}
	}
	c := e.client()
	bearer := func(tok string) int {
		return c.do(http.MethodPost, "/topics/1/groups/g/pause", url.Values{}, map[string]string{"Authorization": "Bearer " + tok}).status
	}
	for i := range 5 {
		if got := bearer(fmt.Sprintf("wrong-guess-%02d-0123456", i)); got != http.StatusUnauthorized {
			t.Fatalf("wrong bearer token %d: %d, want 401", i, got)
		}
	}
	if got := bearer(testToken); got != http.StatusTooManyRequests {
		t.Fatalf("the right bearer token after five wrong ones: %d, want 429", got)
	}
	if r := c.do(http.MethodPost, "/signin", url.Values{"token": {testToken}}, nil); r.status != http.StatusTooManyRequests {
		t.Fatalf("sign-in after five wrong bearer tokens: %d, want 429", r.status)
	}
	if s := e.dbState(); strings.Contains(s, "PAUSED") {
		t.Fatalf("a refused request paused the group: %s", s)
	}
	// From another address (a console whose clients are told apart by a
	// trusted proxy), the token acts.
	e.restart(console.Options{TrustedProxies: []string{"127.0.0.1", "::1"}})
	c = e.client()
	for i := range 5 {
		r := c.do(http.MethodPost, "/topics/1/groups/g/pause", url.Values{},
			map[string]string{"Authorization": "Bearer wrong-guess-0123456789", "X-Forwarded-For": "198.51.100.1"})
		if r.status != http.StatusUnauthorized {
			t.Fatalf("wrong bearer token %d from 198.51.100.1: %d, want 401", i, r.status)
		}
	}
	r := c.do(http.MethodPost, "/topics/1/groups/g/pause", url.Values{},
		map[string]string{"Authorization": "Bearer " + testToken, "X-Forwarded-For": "198.51.100.2"})
	if r.status != http.StatusOK {
		t.Fatalf("the right bearer token from another address: %d, want 200\n%s", r.status, r.body)
	}
}

// TestPagesNeedToken: with PagesNeedToken, every page answers 401 without
// a session or the bearer token (and a wrong bearer token counts toward
// the limit); the sign-in page and the assets stay open; a session or the
// bearer token reads every page. Without it, the pages are open. It is
// refused with ReadOnly, which takes no token.
func TestPagesNeedToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, console.Options{})
	dl := e.fixture()
	first := e.queryInt(`SELECT min(c_offset) FROM outbox_message_t WHERE partition_id = 0`)
	pages := []string{"/", "/topics/1/groups/g", "/topics/1/events", fmt.Sprintf("/topics/1/partitions/0/offsets/%d", first), "/topics/1/hosts?host=host-2",
		"/dead-letters", fmt.Sprintf("/dead-letters/%d", dl), "/replicas", "/audit"}
	open := e.client()
	for _, p := range pages {
		open.mustGet(p)
	}
	cc := e.cpool.Config().ConnConfig
	db := fmt.Sprintf("%s@%s:%d/%s", cc.User, cc.Host, cc.Port, cc.Database)
	e.restart(console.Options{PagesNeedToken: true})
	anon, op := e.client(), e.client()
	op.signIn("ada", testToken)
	bearer := map[string]string{"Authorization": "Bearer " + testToken}
	for _, p := range pages {
		if r := anon.get(p); r.status != http.StatusUnauthorized || strings.Contains(r.body, "host-2") || strings.Contains(r.body, db) ||
			!strings.Contains(r.body, `href="/signin"`) {
			t.Errorf("GET %s without a session: %d, want 401 with a sign-in link and no data (nor the database's name)\n%s", p, r.status, r.body)
		}
		if body := op.mustGet(p); !strings.Contains(body, db) {
			t.Errorf("GET %s signed in does not name the database %s", p, db)
		}
		if r := anon.do(http.MethodGet, p, nil, bearer); r.status != http.StatusOK {
			t.Errorf("GET %s with the bearer token: %d, want 200", p, r.status)
		}
	}
	for _, p := range []string{"/signin", "/assets/console.css", "/assets/console.js"} {
		if body := anon.mustGet(p); strings.Contains(body, db) {
			t.Errorf("GET %s without a session names the database", p)
		}
	}
	for i := range 5 {
		if r := anon.do(http.MethodGet, "/dead-letters", nil, map[string]string{"Authorization": "Bearer wrong-guess-0123456789"}); r.status != http.StatusUnauthorized {
			t.Fatalf("a page with wrong bearer token %d: %d, want 401", i, r.status)
		}
	}
	if r := anon.do(http.MethodGet, "/dead-letters", nil, bearer); r.status != http.StatusTooManyRequests {
		t.Fatalf("a page with the right bearer token after five wrong ones: %d, want 429", r.status)
	}
	if _, err := console.New(e.cpool, console.Options{ReadOnly: true, PagesNeedToken: true}); err == nil || !strings.Contains(err.Error(), "PagesNeedToken") {
		t.Errorf("ReadOnly with PagesNeedToken: %v, want an error naming PagesNeedToken", err)
	}
}

// TestFlashIsFixedText: the message a page shows after an action comes
// from the console's own table by the code in ?done=: a link with any
// other text shows nothing of it, and the counts of a replay show only as
// numbers.
func TestFlashIsFixedText(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, console.Options{})
	e.subscribe("g")
	c := e.client()
	for _, path := range []string{"/topics/1/groups/g", "/dead-letters"} {
		for _, done := range []string{"Your session expired: call +1 555 0100 now", "pause: call +1 555 0100", "<b>x</b>", "replay"} {
			body := c.mustGet(path + "?done=" + url.QueryEscape(done) + "&ok=call+us&failed=1")
			// "+1 555 0100" rather than "555": a port, an offset or a
			// timestamp on the page may hold those digits.
			if strings.Contains(body, `id="done"`) || strings.Contains(body, "+1 555 0100") || strings.Contains(body, "call us") ||
				strings.Contains(body, "<b>x</b>") {
				t.Errorf("GET %s?done=%q shows a message", path, done)
			}
		}
	}
	if body := c.mustGet("/topics/1/groups/g?done=pause"); !strings.Contains(body, "pause: the group is paused") {
		t.Error("done=pause shows no message")
	}
	if body := c.mustGet("/dead-letters?done=discard&ok=3&failed=0"); !strings.Contains(body, "discard: 3 done, 0 failed") {
		t.Error("done=discard&ok=3&failed=0 shows no count")
	}
}

// TestBackIsALocalPath: the page a replay or discard goes back to (the
// form's back field) is a plain path of the console; anything a browser
// could read as another site (TAB, CR, LF or a backslash inside "//",
// a scheme, a leading space) falls back to the dead-letter list.
func TestBackIsALocalPath(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, console.Options{})
	c := e.client()
	c.signIn("ada", testToken)
	for _, back := range []string{"/\t/evil.example", "/\r\n/evil.example", "/\n/evil.example", "//evil.example", "/\\evil.example", `\/evil.example`,
		"https://evil.example/", "javascript:alert(1)", " /evil", "/dead-letters/\x00", "/dead-letters/\x7f", "/x#//evil.example",
		"/x?//evil.example", "evil.example", "/%09/ok\u2028"} {
		r := c.post("/dead-letters/discard", url.Values{"id": {"999999999"}, "back": {back}}, true)
		if loc := r.header.Get("Location"); r.status != http.StatusSeeOther || !strings.HasPrefix(loc, "/dead-letters?done=discard&") {
			t.Errorf("back %q: %d, Location %q; want the dead-letter list", back, r.status, loc)
		}
	}
	r := c.post("/dead-letters/discard", url.Values{"id": {"999999999"}, "back": {"/dead-letters/999999999"}}, true)
	if loc := r.header.Get("Location"); !strings.HasPrefix(loc, "/dead-letters/999999999?done=discard&") {
		t.Errorf("a plain path: Location %q, want it kept", loc)
	}
}

// TestBearerSchemeCaseInsensitive: the Authorization scheme is
// case-insensitive (RFC 7235, section 2.1): "bearer" and "BEARER" act as
// "Bearer" does; a header whose scheme is not Bearer, or that runs scheme
// and token together, does not.
func TestBearerSchemeCaseInsensitive(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, console.Options{})
	e.fixture()
	c := e.client()
	for i, h := range []string{"bearer " + testToken, "BEARER " + testToken, "Bearer  " + testToken} {
		action := []string{"pause", "resume"}[i%2]
		r := c.do(http.MethodPost, "/topics/1/groups/g/"+action, url.Values{}, map[string]string{"Authorization": h})
		if r.status != http.StatusOK {
			t.Errorf("%s with Authorization %q: %d, want 200\n%s", action, strings.Replace(h, testToken, "TOKEN", 1), r.status, r.body)
		}
	}
	for _, h := range []string{"Bearer" + testToken, "Token " + testToken} {
		r := c.do(http.MethodPost, "/topics/1/groups/g/pause", url.Values{}, map[string]string{"Authorization": h})
		if r.status != http.StatusUnauthorized {
			t.Errorf("pause with Authorization %q: %d, want 401", strings.Replace(h, testToken, "TOKEN", 1), r.status)
		}
	}
}
