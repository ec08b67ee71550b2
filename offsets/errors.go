package offsets

import "github.com/pgevents/pgevents/internal/store"

// errPrefix starts every error this package's exported functions return:
// an error message starts with the name of the package the caller imported
// (DESIGN.md, "Errors"). The engine's messages name only the operation and
// get the prefix here.
const errPrefix = "offsets: "

// prefixed returns err starting with errPrefix, once, still wrapping err
// (store.Prefixed).
func prefixed(err error) error { return store.Prefixed(errPrefix, err) }
