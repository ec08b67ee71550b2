package console_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/pgevents/pgevents/console"
	"github.com/pgevents/pgevents/internal/pgtest"
)

// request is one request sent straight to a console's handler: from
// remote (RemoteAddr; default 127.0.0.1:50000), with Host host (default
// 127.0.0.1:8080; none with noHost).
type request struct {
	method, target, host, remote string
	noHost                       bool
	header                       map[string]string
	form                         url.Values
}

func (q request) serve(h http.Handler) *httptest.ResponseRecorder {
	var body *strings.Reader
	if q.form != nil {
		body = strings.NewReader(q.form.Encode())
	} else {
		body = strings.NewReader("")
	}
	req := httptest.NewRequest(q.method, q.target, body)
	req.Host = q.host
	if q.host == "" && !q.noHost {
		req.Host = "127.0.0.1:8080"
	}
	req.RemoteAddr = q.remote
	if q.remote == "" {
		req.RemoteAddr = "127.0.0.1:50000"
	}
	if q.form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range q.header {
		req.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// TestHostHeaderChecked: a request whose Host names another host than the
// console's address, its loopback forms and AllowedHosts gets 421 and
// nothing else, pages, assets and actions alike (a page of another site
// whose name was rebound to the console's address sends its own name);
// the names the console is served as get through.
func TestHostHeaderChecked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, console.Options{})
	cases := []struct {
		addr    string
		allowed []string
		pass    []string
		refuse  []string
	}{
		{addr: "127.0.0.1:8080",
			pass:   []string{"127.0.0.1:8080", "localhost:8080", "LOCALHOST", "[::1]:8080", "127.0.0.1"},
			refuse: []string{"evil.example:8080", "evil.example", "localhost.evil.example", "10.0.0.5:8080", ""}},
		{addr: "[::1]:8080", pass: []string{"[::1]:8080", "localhost:8080", "127.0.0.1:8080"}, refuse: []string{"rebind.example:8080"}},
		{addr: "10.1.2.3:8080", allowed: []string{"console.example.com", "ops.example.com:443"},
			pass:   []string{"10.1.2.3:8080", "console.example.com", "Console.Example.com:8443", "ops.example.com"},
			refuse: []string{"localhost:8080", "127.0.0.1:8080", "10.1.2.4:8080", "evil.example"}},
		{addr: ":8080", pass: []string{"192.0.2.7:8080", "localhost:8080", "[2001:db8::1]:8080"}, refuse: []string{"evil.example:8080"}},
		{addr: "", pass: []string{"127.0.0.1:1234", "localhost"}, refuse: []string{"evil.example"}},
		{addr: "console.internal:8080", pass: []string{"console.internal:8080"}, refuse: []string{"localhost:8080", "evil.example:8080"}},
	}
	for _, tc := range cases {
		con, err := console.New(e.cpool, console.Options{Token: testToken, Addr: tc.addr, AllowedHosts: tc.allowed})
		if err != nil {
			t.Fatal(err)
		}
		for _, host := range tc.pass {
			for _, target := range []string{"/signin", "/assets/console.css"} {
				if w := (request{method: http.MethodGet, target: target, host: host}).serve(con); w.Code != http.StatusOK {
					t.Errorf("Addr %q, allowed %q: GET %s as Host %q: %d, want 200", tc.addr, tc.allowed, target, host, w.Code)
				}
			}
		}
		for _, host := range tc.refuse {
			for _, q := range []request{
				{method: http.MethodGet, target: "/signin"},
				{method: http.MethodGet, target: "/dead-letters"},
				{method: http.MethodGet, target: "/assets/console.js"},
				{method: http.MethodPost, target: "/topics/1/groups/g/pause", header: map[string]string{"Authorization": "Bearer " + testToken}},
			} {
				q.host, q.noHost = host, host == ""
				w := q.serve(con)
				if w.Code != http.StatusMisdirectedRequest || !strings.Contains(w.Body.String(), "allowedHosts") {
					t.Errorf("Addr %q, allowed %q: %s %s as Host %q: %d, want 421 naming allowedHosts\n%s",
						tc.addr, tc.allowed, q.method, q.target, host, w.Code, w.Body)
				}
			}
		}
	}
	if n := e.queryInt(`SELECT count(*) FROM subscriptions WHERE state = 'PAUSED'`); n != 0 {
		t.Fatalf("a request for another host acted: %d groups paused", n)
	}
	for _, bad := range [][]string{{"evil.example/path"}, {""}, {"a b"}, {"https://console.example.com/"}} {
		if _, err := console.New(e.cpool, console.Options{Token: testToken, AllowedHosts: bad}); err == nil {
			t.Errorf("AllowedHosts %q: no error", bad)
		}
	}
	if _, err := console.New(e.cpool, console.Options{Token: testToken, Addr: "localhost"}); err == nil {
		t.Error("Addr without a port: no error")
	}
}

// TestClientAddressBehindProxy: the failures the limiter counts are the
// client's: behind a trusted proxy, the right-most address of
// X-Forwarded-For that is not a trusted proxy's (what the client wrote to
// the left of it changes nothing), so one client's wrong tokens lock out
// that client only; from a peer that is not a trusted proxy,
// X-Forwarded-For is ignored, so a client cannot escape the limit by
// varying it. The audit shows the client's address.
func TestClientAddressBehindProxy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, console.Options{})
	e.subscribe("g")
	con, err := console.New(e.cpool, console.Options{Token: testToken, TrustedProxies: []string{"10.0.0.0/8", "192.0.2.1"},
		Schema: pgtest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	signin := func(remote, xff, token string) int {
		q := request{method: http.MethodPost, target: "/signin", remote: remote, form: url.Values{"token": {token}}}
		if xff != "" {
			q.header = map[string]string{"X-Forwarded-For": xff}
		}
		return q.serve(con).Code
	}
	// The attacker, through two trusted proxies, writes addresses of its
	// own to the left: the address counted is the one the outer proxy saw.
	for i := range 5 {
		if got := signin("10.0.0.2:4000", fmt.Sprintf("203.0.113.%d, 198.51.100.66, 10.9.9.9", i), "a-wrong-guess-0123456"); got != http.StatusUnauthorized {
			t.Fatalf("wrong token %d through the proxies: %d, want 401", i, got)
		}
	}
	if got := signin("10.0.0.2:4000", "203.0.113.99, 198.51.100.66", testToken); got != http.StatusTooManyRequests {
		t.Fatalf("the locked-out client, another address on its left: %d, want 429", got)
	}
	if got := signin("192.0.2.1:4000", "198.51.100.66", testToken); got != http.StatusTooManyRequests {
		t.Fatalf("the locked-out client through the other proxy: %d, want 429", got)
	}
	// Another operator behind the same proxy signs in.
	if got := signin("10.0.0.2:4000", "198.51.100.7", testToken); got != http.StatusSeeOther {
		t.Fatalf("another client behind the same proxy: %d, want 303 (it failed nothing)", got)
	}

	// A peer that is not a trusted proxy is the client, whatever it says.
	for i := range 5 {
		signin("198.51.100.200:4000", fmt.Sprintf("203.0.113.%d", i), "a-wrong-guess-0123456")
	}
	if got := signin("198.51.100.200:4000", "203.0.113.50", testToken); got != http.StatusTooManyRequests {
		t.Fatalf("an untrusted peer varying X-Forwarded-For after five failures: %d, want 429", got)
	}

	// The audit's "from where" is the client's.
	w := request{method: http.MethodPost, target: "/topics/1/groups/g/pause", remote: "10.0.0.2:4000",
		header: map[string]string{"Authorization": "Bearer " + testToken, "X-Forwarded-For": "198.51.100.8"}}.serve(con)
	if w.Code != http.StatusOK {
		t.Fatalf("pause through the proxy: %d\n%s", w.Code, w.Body)
	}
	var remote string
	if err := e.pool.QueryRow(e.ctx, `SELECT remote FROM console_audit WHERE action = 'pause'`).Scan(&remote); err != nil || remote != "198.51.100.8" {
		t.Fatalf("audit remote %q (%v), want the client's 198.51.100.8", remote, err)
	}

	for _, bad := range []string{"10.0.0.0/33", "ten.0.0.1", ""} {
		if _, err := console.New(e.cpool, console.Options{Token: testToken, TrustedProxies: []string{bad}}); err == nil || !strings.Contains(err.Error(), "TrustedProxies") {
			t.Errorf("TrustedProxies %q: %v, want an error naming TrustedProxies", bad, err)
		}
	}
}

// TestFailedCredentialsBurst: a burst of concurrent wrong tokens from one
// address, in the sign-in form or as a bearer token on an action, gets
// the limit's five comparisons and no more: at most five answers are not
// 429.
func TestFailedCredentialsBurst(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, console.Options{})
	const n = 64
	for _, q := range []request{
		{method: http.MethodPost, target: "/signin", form: url.Values{"token": {"a-wrong-guess-0123456"}}},
		{method: http.MethodPost, target: "/topics/1/groups/g/pause", header: map[string]string{"Authorization": "Bearer a-wrong-guess-0123456"}},
	} {
		con, err := console.New(e.cpool, console.Options{Token: testToken})
		if err != nil {
			t.Fatal(err)
		}
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			mu      sync.Mutex
			through int
		)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if code := q.serve(con).Code; code != http.StatusTooManyRequests {
					mu.Lock()
					through++
					mu.Unlock()
				}
			}()
		}
		close(start)
		wg.Wait()
		if through > 5 {
			t.Errorf("POST %s: %d of %d concurrent wrong tokens were compared (not 429), want at most 5", q.target, through, n)
		}
	}
}
