package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode"
)

// cookieName is the session cookie's name.
const cookieName = "pgevents_console"

// maxSessions bounds the sessions kept in memory; a sign-in beyond it
// replaces the oldest.
const maxSessions = 10000

// session is a browser's sign-in: who (the name given), its CSRF token
// and when it ends. Sessions live in the process: a restart signs
// everyone out.
type session struct {
	actor   string
	csrf    string
	expires time.Time
}

// sessions maps the hash of each session id to its session.
type sessions struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[string]*session
}

func newSessions(ttl time.Duration) *sessions {
	return &sessions{ttl: ttl, m: map[string]*session{}}
}

// create starts a session for actor and returns its id (the cookie's
// value).
func (s *sessions) create(actor string) (string, *session) {
	id := randomToken()
	ss := &session{actor: actor, csrf: randomToken(), expires: time.Now().Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var oldest string
	for k, v := range s.m {
		if now.After(v.expires) {
			delete(s.m, k)
		} else if oldest == "" || v.expires.Before(s.m[oldest].expires) {
			oldest = k
		}
	}
	if len(s.m) >= maxSessions {
		delete(s.m, oldest)
	}
	s.m[hashID(id)] = ss
	return id, ss
}

// get returns the live session of id, or nil.
func (s *sessions) get(id string) *session {
	if id == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.m[hashID(id)]
	if ss == nil || time.Now().After(ss.expires) {
		return nil
	}
	return ss
}

// end removes the session of id.
func (s *sessions) end(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, hashID(id))
}

func hashID(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:])
}

// randomToken returns 32 random bytes, base64url.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// equal compares secrets in constant time (of their hashes, so that the
// length does not leak either).
func equal(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}

// limiter counts failed credentials (a wrong token in the sign-in form or
// in an Authorization header) per client address in a window: after max
// failures, the address gets 429 for the rest of the window, the right
// token included (else a guess that is right would stand out).
type limiter struct {
	max    int
	window time.Duration
	mu     sync.Mutex
	m      map[string]*window
}

type window struct {
	start time.Time
	n     int
}

func newLimiter(max int, w time.Duration) *limiter {
	return &limiter{max: max, window: w, m: map[string]*window{}}
}

// check runs valid, the comparison of a credential addr gave, unless addr
// failed max times within the window, and counts it when it fails. The
// check, the comparison and the count are one step under the lock: a
// burst of concurrent guesses gets max comparisons, not one per request
// that saw the count below max. It returns whether the credential is
// right, and whether addr was refused without a comparison.
func (l *limiter) check(addr string, valid func() bool) (ok, blocked bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	w := l.m[addr]
	if w != nil && now.Sub(w.start) >= l.window {
		delete(l.m, addr)
		w = nil
	}
	if w != nil && w.n >= l.max {
		return false, true
	}
	if valid() {
		return true, false
	}
	if w == nil {
		for k, x := range l.m {
			if now.Sub(x.start) >= l.window {
				delete(l.m, k)
			}
		}
		w = &window{start: now}
		l.m[addr] = w
	}
	w.n++
	return false, false
}

// actor is who acts: the name given at sign-in (or in the X-Console-Actor
// header of a script), and from where.
type actor struct {
	name   string
	remote string
	bearer bool     // a script, with the token in Authorization
	sess   *session // a browser session; nil for a script
}

// crossSite reports whether the browser says the request comes from
// another site: Sec-Fetch-Site when the browser sends it, else an Origin
// that is not this host ("null", which a browser sends when it hides the
// origin, says nothing either way: the CSRF token decides).
func crossSite(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" {
		return s != "same-origin" && s != "none"
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		return err != nil || u.Host != r.Host
	}
	return false
}

// currentSession returns the request's live browser session, or nil.
func (c *Console) currentSession(r *http.Request) *session {
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	return c.sessions.get(ck.Value)
}

// credentials is who the request's credentials say it is: a script with
// the token in an Authorization header, or a browser's live session. It
// returns nil and the status to answer when there is none: 401, or 429
// when the client address failed too often. Every credential that is
// wrong counts against the address (the limiter), a bearer token as a
// sign-in does. A session cookie that names no live session does not: its
// id is 256 random bits, not guessed, and a cookie that outlived its
// session would lock its operator out.
// bearerToken returns the token of an Authorization header of the Bearer
// scheme, whose name is case-insensitive (RFC 7235, section 2.1: "bearer",
// "BEARER"), separated from the token by one or more spaces.
func bearerToken(auth string) (string, bool) {
	scheme, tok, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimLeft(tok, " "), true
}

func (c *Console) credentials(r *http.Request) (*actor, int, string) {
	a := &actor{remote: c.clientAddr(r)}
	if auth := r.Header.Get("Authorization"); auth != "" {
		tok, isBearer := bearerToken(auth)
		ok, blocked := c.signins.check(a.remote, func() bool { return isBearer && equal(tok, c.opts.Token) })
		switch {
		case blocked:
			return nil, http.StatusTooManyRequests, "too many failed attempts with a wrong token: wait a minute"
		case !ok:
			return nil, http.StatusUnauthorized, "the token is wrong"
		}
		a.bearer = true
		a.name = cleanName(r.Header.Get("X-Console-Actor"), "script")
		return a, 0, ""
	}
	if a.sess = c.currentSession(r); a.sess == nil {
		return nil, http.StatusUnauthorized, "sign in with the console's token first"
	}
	a.name = a.sess.actor
	return a, 0, ""
}

// refuse answers an action (or a page, when pages need the token) that
// the request's credentials do not allow, and logs it.
func (c *Console) refuse(w http.ResponseWriter, r *http.Request, status int, why string) {
	msg := "action refused"
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		msg = "page refused"
	}
	c.log.Warn().Str("path", r.URL.Path).Str("remote", c.clientAddr(r)).Int("status", status).Str("why", why).Msg(msg)
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="pgevents console"`)
	}
	c.fail(w, r, status, why)
}

// action wraps an action handler: it runs only for a request with the
// token (a bearer header, or a browser session and its CSRF token), from
// this site, to a console that is not read-only. Anything else is
// refused before the handler runs, so it changes nothing: 401 without
// valid credentials, 429 after too many wrong tokens from the client's
// address, 403 without the CSRF token, from another site, or in
// read-only mode.
func (c *Console) action(h func(w http.ResponseWriter, r *http.Request, a *actor)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c.opts.ReadOnly {
			c.refuse(w, r, http.StatusForbidden, "this console is read-only: it takes no action")
			return
		}
		a, status, why := c.credentials(r)
		if a == nil {
			c.refuse(w, r, status, why)
			return
		}
		if a.bearer {
			h(w, r, a)
			return
		}
		if crossSite(r) {
			c.refuse(w, r, http.StatusForbidden, "cross-site request")
			return
		}
		csrf := r.Header.Get("X-CSRF-Token")
		if csrf == "" {
			csrf = r.PostFormValue("csrf")
		}
		if csrf == "" || !equal(csrf, a.sess.csrf) {
			c.refuse(w, r, http.StatusForbidden, "the form's CSRF token is missing or wrong: reload the page")
			return
		}
		h(w, r, a)
	}
}

// cleanName keeps a name fit for the audit log: printable, at most 100
// characters, def when empty.
func cleanName(s, def string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, strings.TrimSpace(s))
	if r := []rune(s); len(r) > 100 {
		s = string(r[:100])
	}
	if s == "" {
		return def
	}
	return s
}

// signin checks the token of the sign-in form and starts a session: an
// HttpOnly, SameSite=Strict cookie, Secure over TLS. Failures are limited
// per client address.
func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	addr := c.clientAddr(r)
	if crossSite(r) {
		c.fail(w, r, http.StatusForbidden, "cross-site request")
		return
	}
	tok := r.PostFormValue("token")
	ok, blocked := c.signins.check(addr, func() bool { return equal(tok, c.opts.Token) })
	if blocked {
		c.log.Warn().Str("remote", addr).Msg("sign-in refused: too many failures")
		c.fail(w, r, http.StatusTooManyRequests, "too many failed sign-ins: wait a minute")
		return
	}
	if !ok {
		c.log.Warn().Str("remote", addr).Msg("sign-in failed: wrong token")
		c.renderStatus(w, r, http.StatusUnauthorized, "signin", "Sign in", signinData{Failed: true, Name: r.PostFormValue("name")})
		return
	}
	name := cleanName(r.PostFormValue("name"), "operator")
	id, _ := c.sessions.create(name)
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: id, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: c.secure(r), MaxAge: int(c.opts.SessionTTL / time.Second),
	})
	c.log.Info().Str("actor", name).Str("remote", addr).Msg("signed in")
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// secure reports whether the session cookie is Secure: the request came
// over TLS, through a proxy that says it did (X-Forwarded-Proto: a
// Secure cookie the client then does not send back over plain HTTP is
// the worst a lying header does), or Options.SecureCookie.
func (c *Console) secure(r *http.Request) bool {
	return c.opts.SecureCookie || r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https"
}

// signout ends the session.
func (c *Console) signout(w http.ResponseWriter, r *http.Request, a *actor) {
	if ck, err := r.Cookie(cookieName); err == nil {
		c.sessions.end(ck.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: c.secure(r), MaxAge: -1})
	c.log.Info().Str("actor", a.name).Str("remote", a.remote).Msg("signed out")
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// signinData is the sign-in page's.
type signinData struct {
	Failed bool
	Name   string
}

func (c *Console) signinPage(r *http.Request) (string, string, any, error) {
	return "signin", "Sign in", signinData{}, nil
}
