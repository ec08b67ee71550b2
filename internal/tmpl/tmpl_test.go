package tmpl

import (
	"strings"
	"testing"
)

func TestParseAndRender(t *testing.T) {
	t.Parallel()
	get := func(f string) string { return "<" + f + ">" }
	cases := []struct {
		src, want string
		key       bool
	}{
		{"portal-events", "portal-events", false},
		{"portal.{event_type}", "portal.<event_type>", false},
		{"{host_id}", "<host_id>", false},
		{"{topic_id}-{partition_id}.x", "<topic_id>-<partition_id>.x", false},
		{"host_id", "<host_id>", true},
		{"host_id", "host_id", false},
		{"tenant-{user_id}", "tenant-<user_id>", true},
	}
	for _, tc := range cases {
		parse := Parse
		if tc.key {
			parse = ParseKey
		}
		tp, err := parse(tc.src)
		if err != nil {
			t.Fatalf("%q: %v", tc.src, err)
		}
		if got := tp.Render(get); got != tc.want {
			t.Errorf("%q renders %q, want %q", tc.src, got, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	for src, want := range map[string]string{
		"":                 "empty",
		"a.{event_type":    "without '}'",
		"a}b":              "without '{'",
		"a.{payload}":      "unknown field {payload}",
		"{}":               "unknown field {}",
		"x.{{event_type}}": "unknown field {{event_type}",
	} {
		_, err := Parse(src)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error with %q", src, err, want)
		}
	}
}
