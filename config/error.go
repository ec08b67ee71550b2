package config

import (
	"strconv"
	"strings"
)

// Error is a configuration error that names the offending key.
//
// Key uses the YAML spelling, with a path for nested keys: "batchSize",
// "handlers[2].statement" (handler indexes start at 0). Key is empty only
// when the file itself cannot be read or parsed. Line is the 1-based line
// of the offending key in the file, or 0 when unknown (for example when a
// required key is missing). File is the path given to [Load], or empty.
type Error struct {
	// File is the path of the configuration file, or empty.
	File string
	// Key is the YAML path of the offending key, or empty.
	Key string
	// Line is the 1-based line of the offending key, or 0 when unknown.
	Line int
	// Msg describes the problem.
	Msg string

	err error // underlying cause, if any; see Unwrap
}

// Error formats the error as, for example,
// "config db-event-consumer.yml: batchSize: must be greater than 0 (line 3)",
// leaving out the parts that are empty or zero.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config")
	if e.File != "" {
		b.WriteString(" ")
		b.WriteString(e.File)
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	if e.Line > 0 {
		b.WriteString(" (line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(")")
	}
	return b.String()
}

// Unwrap returns the underlying cause, such as the [fs.ErrNotExist] behind a
// missing file, or nil.
func (e *Error) Unwrap() error { return e.err }

// Warning is what the file says that is read, but should be said
// otherwise: a deprecated key. It names the key as an [*Error] does; the
// commands log each at start (see [Config.Warnings]).
type Warning struct {
	// File is the path of the configuration file, or empty.
	File string
	// Key is the YAML path of the key.
	Key string
	// Line is the 1-based line of the key, or 0 when unknown.
	Line int
	// Msg describes what to do.
	Msg string
}

// String formats the warning as an Error formats an error:
// "config db-event-consumer.yml: console.addr: is deprecated: ... (line 12)".
func (w Warning) String() string {
	e := Error{File: w.File, Key: w.Key, Line: w.Line, Msg: w.Msg}
	return e.Error()
}
