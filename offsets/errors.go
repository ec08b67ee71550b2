package offsets

import (
	"fmt"
	"strings"
)

// errPrefix starts every error this package's exported functions return:
// an error message starts with the name of the package the caller imported
// (DESIGN.md, "Errors"). The engine's messages name only the operation and
// get the prefix here.
const errPrefix = "offsets: "

// prefixed returns err starting with errPrefix, wrapped with %w so that
// errors.Is and errors.As still find the sentinel or typed error it wraps;
// nil stays nil, and an error that has the prefix already is returned as
// it is.
func prefixed(err error) error {
	if err == nil || strings.HasPrefix(err.Error(), errPrefix) {
		return err
	}
	return fmt.Errorf("%s%w", errPrefix, err)
}
