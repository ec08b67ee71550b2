package console

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/pgevents/pgevents/internal/human"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets/*
var assetFS embed.FS

// templates holds one template set per page, each with the layout.
type templates map[string]*template.Template

// pageNames are the pages, each templates/<name>.html.
var pageNames = []string{"overview", "group", "reset", "deadletters", "deadletter", "events", "event", "host",
	"replicas", "audit", "signin", "error"}

func parseTemplates() (templates, error) {
	out := templates{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/parts.html",
			"templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// view is what every page's template gets: the page's own data in Data,
// and what the layout needs.
type view struct {
	Title    string
	Page     string
	Data     any
	Actor    string // the signed-in name; "" when not signed in
	CSRF     string // the session's CSRF token, for action forms
	CanAct   bool   // signed in to a console that acts: action forms are shown
	ReadOnly bool
	DB       string // user@host:port/database
	Refresh  int    // milliseconds between live refreshes
}

// render writes page name with data, inside the layout.
func (c *Console) render(w http.ResponseWriter, r *http.Request, name, title string, data any) {
	c.renderStatus(w, r, http.StatusOK, name, title, data)
}

// renderStatus is render with an HTTP status.
func (c *Console) renderStatus(w http.ResponseWriter, r *http.Request, status int, name, title string, data any) {
	v := view{Title: title, Page: name, Data: data, ReadOnly: c.opts.ReadOnly, DB: c.dbLabel,
		Refresh: int(c.opts.Refresh / time.Millisecond)}
	s := c.currentSession(r)
	if s != nil && !c.opts.ReadOnly {
		v.Actor, v.CSRF, v.CanAct = s.actor, s.csrf, true
	}
	if c.opts.PagesNeedToken && s == nil && r.Context().Value(bearerKey{}) == nil {
		v.DB = "" // the database is named to those who signed in only
	}
	var b bytes.Buffer
	if err := c.pages[name].Execute(&b, v); err != nil {
		c.log.Error().Err(err).Str("page", name).Msg("render")
		http.Error(w, "console: cannot render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// pageFunc loads a page's data: it returns the template's name, the
// title and the data, or an error (a *statusError for the client's).
type pageFunc func(r *http.Request) (name, title string, data any, err error)

// page serves a pageFunc behind the token when Options.PagesNeedToken
// says so (see servePage).
func (c *Console) page(f pageFunc) http.HandlerFunc {
	serve := c.servePage(f)
	if !c.opts.PagesNeedToken {
		return serve
	}
	return func(w http.ResponseWriter, r *http.Request) {
		a, status, why := c.credentials(r)
		if a == nil {
			c.refuse(w, r, status, why)
			return
		}
		if a.bearer {
			r = r.WithContext(context.WithValue(r.Context(), bearerKey{}, true))
		}
		serve(w, r)
	}
}

// bearerKey marks the context of a page request that gave the bearer
// token.
type bearerKey struct{}

// servePage serves a pageFunc: the page, or the error's.
func (c *Console) servePage(f pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name, title, data, err := f(r)
		if err != nil {
			var se *statusError
			if errors.As(err, &se) {
				c.fail(w, r, se.status, se.msg)
				return
			}
			c.log.Error().Err(err).Str("path", r.URL.Path).Msg("page")
			c.fail(w, r, http.StatusInternalServerError, err.Error())
			return
		}
		c.render(w, r, name, title, data)
	}
}

// statusError is an error that answers with its status.
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &statusError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &statusError{http.StatusNotFound, fmt.Sprintf(format, args...)}
}

// errorData is the error page's.
type errorData struct {
	Status int
	Text   string
	Msg    string
	SignIn bool
}

// fail answers with status and msg: JSON to a script (a bearer request or
// one that accepts only JSON), the error page to a browser. The database
// password never appears in msg.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	msg = c.redact(msg)
	if wantsJSON(r) {
		writeJSON(w, status, map[string]any{"error": msg, "status": status})
		return
	}
	c.renderStatus(w, r, status, "error", http.StatusText(status), errorData{Status: status, Text: http.StatusText(status), Msg: msg,
		SignIn: status == http.StatusUnauthorized && !c.opts.ReadOnly})
}

// wantsJSON reports whether the client is a script: it sent the token in
// Authorization, or asks for JSON.
func wantsJSON(r *http.Request) bool {
	return r.Header.Get("Authorization") != "" || r.Header.Get("Accept") == "application/json"
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// asset serves an embedded file of assets/.
func (c *Console) asset(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	b, err := fs.ReadFile(assetFS, "assets/"+path.Base(name))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", mime.TypeByExtension(path.Ext(name)))
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(b)
}

// funcs are the templates' helpers. None returns template.HTML: whatever
// they return is escaped for its context.
var funcs = template.FuncMap{
	"groupURL": func(topic int, group string) string {
		return "/topics/" + strconv.Itoa(topic) + "/groups/" + url.PathEscape(group)
	},
	"eventURL": func(topic, partition int, offset int64) string {
		return fmt.Sprintf("/topics/%d/partitions/%d/offsets/%d", topic, partition, offset)
	},
	"hostURL": func(topic int, host string) string {
		return "/topics/" + strconv.Itoa(topic) + "/hosts?host=" + url.QueryEscape(host)
	},
	"eventsURL": func(topic int) string { return "/topics/" + strconv.Itoa(topic) + "/events" },
	"dlURL": func(id any) string {
		switch v := id.(type) {
		case int64:
			return "/dead-letters/" + strconv.FormatInt(v, 10)
		case *int64:
			if v != nil {
				return "/dead-letters/" + strconv.FormatInt(*v, 10)
			}
		}
		return "/dead-letters"
	},
	"pretty":     prettyJSON,
	"ts":         formatTime,
	"ago":        formatAgo,
	"dur":        formatDur,
	"count":      formatCount,
	"clock":      formatClock,
	"pct":        func(f float64) string { return strconv.FormatFloat(f*100, 'f', 1, 64) + " %" },
	"lagCap":     func() int { return lagCountCap },
	"previewCap": func() int { return previewCountCap },
	"opt": func(v *int64) string {
		if v == nil {
			return "-"
		}
		return strconv.FormatInt(*v, 10)
	},
	// rate writes a figure of the samples, "—" when there is none (its
	// Title says why).
	"rate": func(f figure) string {
		if !f.OK {
			return "—"
		}
		return human.Rate(f.V)
	},
	"short": func(s string, n int) string {
		s = strings.Join(strings.Fields(s), " ")
		if r := []rune(s); len(r) > n {
			return string(r[:n-1]) + "…"
		}
		return s
	},
	"seq":  func(n int) []struct{} { return make([]struct{}, n) },
	"join": strings.Join,
}

// prettyJSON indents a JSON document for reading; anything else comes back
// as it is (to be escaped like any text).
func prettyJSON(b []byte) string {
	if len(b) == 0 {
		return "null"
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return string(b)
	}
	return out.String()
}

// formatTime renders a time.Time or *time.Time in UTC; "-" for none.
func formatTime(v any) string { return formatUTC(v, "2006-01-02 15:04:05.000Z") }

// formatClock writes the time of day of a time.Time or *time.Time in
// UTC, "15:04:05Z"; "-" for none.
func formatClock(v any) string { return formatUTC(v, "15:04:05Z") }

// formatUTC formats a time.Time or *time.Time in UTC with layout; "-" for
// none (a nil pointer, a zero time, another type).
func formatUTC(v any, layout string) string {
	var t time.Time
	switch x := v.(type) {
	case time.Time:
		t = x
	case *time.Time:
		if x != nil {
			t = *x
		}
	}
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(layout)
}

// formatAgo is the time from t to now, on the server's clock.
func formatAgo(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return human.Duration(time.Since(t))
}

// formatDur writes a duration for a reader (human.Duration), given as
// seconds (a float64, or a *float64: "none" when nil) or a
// time.Duration: the console's one way of writing durations.
func formatDur(v any) string {
	switch x := v.(type) {
	case float64:
		return human.Seconds(x)
	case *float64:
		if x == nil {
			return "none"
		}
		return human.Seconds(*x)
	case time.Duration:
		return human.Duration(x)
	}
	return fmt.Sprint(v)
}

// formatCount writes a count with thousands separators (human.Count).
func formatCount(v any) string {
	switch x := v.(type) {
	case int64:
		return human.Count(x)
	case int:
		return human.Count(int64(x))
	case *int64:
		if x == nil {
			return "-"
		}
		return human.Count(*x)
	}
	return fmt.Sprint(v)
}
