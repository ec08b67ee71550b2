package pgtest

import (
	"context"
	"fmt"
	neturl "net/url"
	"sync"
	"testing"

	"github.com/pgevents/pgevents/schema"
)

// ExampleDB returns the URL of a fresh migrated database holding topic 1
// with the given partition count, for a runnable example (an example has
// no testing.TB). In schema mode the URL's sessions search pgevents'
// schema first, so that an example's plain names find it. The database is
// dropped when the test binary's tests and examples have run; a failure
// panics, which fails the example.
func ExampleDB(partitions int) string {
	tb := &exampleTB{name: "example"}
	url := MigratedDB(tb)
	ctx := Context(context.Background())
	pool := Pool(tb, url)
	defer pool.Close()
	if _, _, err := schema.EnsureTopicSpec(ctx, pool, schema.TopicSpec{ID: 1, Partitions: partitions, Scope: Scope()}); err != nil {
		panic(fmt.Sprintf("pgtest: example topic: %v", err))
	}
	if n := Schema(); n != "" {
		u, err := neturl.Parse(url)
		if err != nil {
			panic(fmt.Sprintf("pgtest: example URL: %v", err))
		}
		q := u.Query()
		q.Set("search_path", n+",public")
		u.RawQuery = q.Encode()
		url = u.String()
	}
	return url
}

// exampleCleanups are the cleanups of ExampleDB's databases, run by Main
// after the tests and examples.
var (
	exampleMu       sync.Mutex
	exampleCleanups []func()
)

// runExampleCleanups runs the cleanups ExampleDB registered, newest first.
func runExampleCleanups() {
	exampleMu.Lock()
	defer exampleMu.Unlock()
	for i := len(exampleCleanups) - 1; i >= 0; i-- {
		exampleCleanups[i]()
	}
	exampleCleanups = nil
}

// exampleTB is the testing.TB of an example: Fatal panics (failing the
// example), Errorf (a cleanup's) prints, Cleanup defers to the end of the
// test binary. Methods pgtest does not call panic (the
// embedded interface is nil).
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
