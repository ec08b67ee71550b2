// Package tmpl parses and renders the small templates over an event's
// fields that the relay handlers take in their configuration, such as a
// Kafka topic "portal.{event_type}" or a record key "{host_id}".
//
// A template is literal text with fields in braces; the fields are the
// event's columns: event_type, host_id, user_id, event_id, topic_id,
// partition_id, transaction_id and c_offset. There is no escaping: a brace
// is always a field's delimiter. The package imports nothing of pgevents,
// so that the config package can validate templates.
package tmpl

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Fields are the names a template may use, in the order the documentation
// lists them.
var Fields = []string{"event_type", "host_id", "user_id", "event_id", "topic_id", "partition_id", "transaction_id", "c_offset"}

// Template is a parsed template.
type Template struct {
	src   string
	parts []part
}

// part is a literal, or a field when field is not empty.
type part struct {
	lit   string
	field string
}

// Parse parses s, which must not be empty, and must close every brace it
// opens around a known field.
func Parse(s string) (*Template, error) {
	if s == "" {
		return nil, errors.New("is empty")
	}
	t := &Template{src: s}
	rest := s
	for rest != "" {
		open := strings.IndexAny(rest, "{}")
		if open < 0 {
			t.parts = append(t.parts, part{lit: rest})
			break
		}
		if rest[open] == '}' {
			return nil, fmt.Errorf("has a '}' without '{' in %q", s)
		}
		if open > 0 {
			t.parts = append(t.parts, part{lit: rest[:open]})
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return nil, fmt.Errorf("has a '{' without '}' in %q", s)
		}
		name := rest[open+1 : open+end]
		if !slices.Contains(Fields, name) {
			return nil, fmt.Errorf("has an unknown field {%s} in %q (fields: %s)", name, s, strings.Join(Fields, ", "))
		}
		t.parts = append(t.parts, part{field: name})
		rest = rest[open+end+1:]
	}
	return t, nil
}

// ParseKey parses s as Parse does, except that a bare field name stands
// for that field: "host_id" means "{host_id}".
func ParseKey(s string) (*Template, error) {
	if slices.Contains(Fields, s) {
		return &Template{src: s, parts: []part{{field: s}}}, nil
	}
	return Parse(s)
}

// String returns the template as written.
func (t *Template) String() string { return t.src }

// Static returns the template's text and true when it uses no field.
func (t *Template) Static() (string, bool) {
	for _, p := range t.parts {
		if p.field != "" {
			return "", false
		}
	}
	return t.src, true
}

// Uses reports whether the template uses field.
func (t *Template) Uses(field string) bool {
	for _, p := range t.parts {
		if p.field == field {
			return true
		}
	}
	return false
}

// Render returns the template with each field replaced by get(field).
func (t *Template) Render(get func(field string) string) string {
	if len(t.parts) == 1 {
		if p := t.parts[0]; p.field != "" {
			return get(p.field)
		}
		return t.parts[0].lit
	}
	var b strings.Builder
	for _, p := range t.parts {
		if p.field != "" {
			b.WriteString(get(p.field))
		} else {
			b.WriteString(p.lit)
		}
	}
	return b.String()
}
