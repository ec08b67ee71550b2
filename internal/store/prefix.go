package store

import (
	"fmt"
	"strings"
)

// Prefixed returns err starting with prefix (a public package's name and
// ": "), wrapped with %w so that errors.Is and errors.As still find the
// sentinel or typed error it wraps. nil stays nil, and an error that starts
// with prefix already is returned as it is (never "pgevents: pgevents: ").
// This package's messages name only the operation: the public package that
// returns them adds its name here (DESIGN.md, "Errors").
func Prefixed(prefix string, err error) error {
	if err == nil || strings.HasPrefix(err.Error(), prefix) {
		return err
	}
	return fmt.Errorf("%s%w", prefix, err)
}
