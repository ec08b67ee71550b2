package pgtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// ExampleTB returns the testing.TB of a runnable example, which has none,
// for the helpers of this package and of pgeventstest: Fatal panics (which
// fails the example), Errorf (a cleanup's) panics too, and Cleanup defers
// to the end of the test binary, after its tests and examples have run
// (Main). Methods the helpers do not call panic (the embedded interface is
// nil).
func ExampleTB(name string) testing.TB { return &exampleTB{name: name} }

// exampleCleanups are the cleanups of the examples' resources, run by Main
// after the tests and examples.
var (
	exampleMu       sync.Mutex
	exampleCleanups []func()
)

// runExampleCleanups runs the cleanups ExampleTB registered, newest first.
func runExampleCleanups() {
	exampleMu.Lock()
	defer exampleMu.Unlock()
	for i := len(exampleCleanups) - 1; i >= 0; i-- {
		exampleCleanups[i]()
	}
	exampleCleanups = nil
}

type exampleTB struct {
	testing.TB
	name string
}

func (*exampleTB) Helper()                           {}
func (t *exampleTB) Name() string                    { return t.name }
func (*exampleTB) Context() context.Context          { return context.Background() }
func (*exampleTB) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (*exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (*exampleTB) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (*exampleTB) Cleanup(f func()) {
	exampleMu.Lock()
	defer exampleMu.Unlock()
	exampleCleanups = append(exampleCleanups, f)
}
