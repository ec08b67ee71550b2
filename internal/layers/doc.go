// Package layers holds no code: its test, layers_test.go, is the table of
// the module's import rules, which package may import which, checked
// against what `go list` says every package imports.
//
// The layering, lowest first: schema and pgeventstype; the internal
// packages (the engine, internal/store and internal/lease, and small
// utilities); the public layers (offsets, partition, batching, listener,
// adopt); the root package pgevents; the packages built on it (config,
// sink/*, metrics, console, the Kafka endpoint kafka, pgeventstest); the
// CLI (cmd/consumer/consumercli); the commands (cmd/*). A package imports
// only from layers below its own, and a new package fails the test until
// the table gives it a row.
package layers
