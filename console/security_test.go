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
// form's).
func TestActionsRequireTheTokenAndCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, console.Options{})
	dl := e.fixture()
	e.restart(console.Options{Resolvers: resolverFor(t, e, 2)})
	anon, op, other := e.client(), e.client(), e.client()
	op.signIn("ada", testToken)
	other.signIn("eve", testToken)
	if op.csrf == other.csrf {
		t.Fatal("two sessions share a CSRF token")
	}
	before := e.dbState()
	for _, a := range allActions(dl) {
		try := func(what string, want int, c *client, form url.Values, header map[string]string) {
			t.Helper()
			r := c.do(http.MethodPost, a.path, form, header)
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
