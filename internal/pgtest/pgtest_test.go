package pgtest_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func queryString(t *testing.T, pool *pgxpool.Pool, sql string) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(t.Context(), sql).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func TestServer(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.Server(t))
	if n := queryInt(t, pool, "SELECT 1"); n != 1 {
		t.Fatalf("SELECT 1 = %d", n)
	}
}

// TestParallelDatabasesAreIsolated runs two parallel tests that each create
// a table once both have their database, and checks that each database
// holds only its own table.
func TestParallelDatabasesAreIsolated(t *testing.T) {
	var (
		mu      sync.Mutex
		names   = map[string]string{} // subtest -> current_database()
		created atomic.Int32
	)
	t.Run("group", func(t *testing.T) {
		for _, sub := range []string{"a", "b"} {
			t.Run(sub, func(t *testing.T) {
				t.Parallel()
				pool := pgtest.Pool(t, pgtest.NewDB(t))
				db := queryString(t, pool, "SELECT current_database()")
				mu.Lock()
				names[sub] = db
				mu.Unlock()
				if n := queryInt(t, pool, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"); n != 0 {
					t.Fatalf("new database has %d tables", n)
				}
				if _, err := pool.Exec(t.Context(), "CREATE TABLE only_in_"+sub+" (v int)"); err != nil {
					t.Fatal(err)
				}
				created.Add(1)
				pgtest.WaitFor(t, 30*time.Second, "both parallel tests to create their table", func() bool {
					return created.Load() == 2
				})
				other := map[string]string{"a": "b", "b": "a"}[sub]
				if n := queryInt(t, pool, "SELECT count(*) FROM pg_tables WHERE tablename = $1", "only_in_"+other); n != 0 {
					t.Errorf("table only_in_%s, created by the other test, is visible in %s", other, db)
				}
				if n := queryInt(t, pool, "SELECT count(*) FROM pg_tables WHERE tablename = $1", "only_in_"+sub); n != 1 {
					t.Errorf("own table only_in_%s missing", sub)
				}
			})
		}
	})
	if names["a"] == "" || names["a"] == names["b"] {
		t.Fatalf("databases not distinct: %v", names)
	}
	for sub, db := range names {
		if want := "testparalleldatabasesareisolated_group_" + sub + "_"; !strings.HasPrefix(db, want) {
			t.Errorf("database %q, want prefix %q", db, want)
		}
	}

	// The subtests' cleanups dropped their databases.
	pool := pgtest.Pool(t, pgtest.Server(t))
	for _, db := range names {
		if n := queryInt(t, pool, "SELECT count(*) FROM pg_database WHERE datname = $1", db); n != 0 {
			t.Errorf("database %s not dropped", db)
		}
	}
}

func TestNewDBLongName(t *testing.T) {
	t.Run(strings.Repeat("Very Long-Name ", 10), func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t, pgtest.NewDB(t))
		db := queryString(t, pool, "SELECT current_database()")
		if len(db) > 63 {
			t.Fatalf("database name %q is %d bytes", db, len(db))
		}
		if !strings.HasPrefix(db, "testnewdblongname_very_long_name_very") {
			t.Fatalf("database name %q not derived from the test name", db)
		}
	})
}

// TestTemplate prepares one template from several parallel tests and clones
// it for each: prepare runs once, every clone starts with the prepared data
// and clones do not share writes.
func TestTemplate(t *testing.T) {
	var prepared atomic.Int32
	prepare := func(ctx context.Context, url string) error {
		prepared.Add(1)
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "CREATE TABLE seeded (v text); INSERT INTO seeded VALUES ('from template')")
		return err
	}
	t.Run("group", func(t *testing.T) {
		for i := range 4 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				tpl := pgtest.Template(t, "pgtest_seeded", prepare)
				url := pgtest.NewDBFrom(t, tpl)
				if i%2 == 1 {
					// The name given to Template works too.
					url = pgtest.NewDBFrom(t, "pgtest_seeded")
				}
				pool := pgtest.Pool(t, url)
				if got := queryString(t, pool, "SELECT v FROM seeded"); got != "from template" {
					t.Fatalf("seeded.v = %q", got)
				}
				if _, err := pool.Exec(t.Context(), "INSERT INTO seeded VALUES ($1)", fmt.Sprint(i)); err != nil {
					t.Fatal(err)
				}
				if n := queryInt(t, pool, "SELECT count(*) FROM seeded"); n != 2 {
					t.Fatalf("seeded has %d rows, want 2 (template row + own)", n)
				}
			})
		}
	})
	if n := prepared.Load(); n != 1 {
		t.Fatalf("prepare ran %d times, want 1", n)
	}
}

// fakeTB records failures instead of reporting them; Fatal and FailNow end
// the calling goroutine, as testing.T's do.
type fakeTB struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	msgs   []string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = true
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	runtime.Goexit()
}

func (f *fakeTB) Fatal(args ...any) {
	f.Errorf("%s", fmt.Sprint(args...))
	runtime.Goexit()
}

func (f *fakeTB) FailNow() {
	f.Errorf("FailNow")
	runtime.Goexit()
}

func (f *fakeTB) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

func (f *fakeTB) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.msgs, "\n")
}

// runFake runs fn with a fakeTB in its own goroutine, so that a Fatal ends
// only that goroutine, and returns the fakeTB once fn is done.
func runFake(t *testing.T, fn func(tb testing.TB)) *fakeTB {
	fake := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(fake)
	}()
	<-done
	return fake
}

func TestWaitForTimeout(t *testing.T) {
	var calls atomic.Int32
	start := time.Now()
	fake := runFake(t, func(tb testing.TB) {
		pgtest.WaitFor(tb, 50*time.Millisecond, "the impossible", func() bool {
			calls.Add(1)
			return false
		})
		tb.Errorf("WaitFor returned instead of failing")
	})
	if !fake.Failed() || !strings.Contains(fake.String(), "timed out after 50ms waiting for: the impossible") {
		t.Fatalf("WaitFor did not fail as expected; messages: %q", fake)
	}
	if strings.Contains(fake.String(), "returned instead") {
		t.Fatal("WaitFor did not stop the test")
	}
	if elapsed := time.Since(start); elapsed < 50*time.Millisecond {
		t.Fatalf("WaitFor gave up after %s, before its timeout", elapsed)
	}
	if n := calls.Load(); n < 2 {
		t.Fatalf("cond called %d times; WaitFor should poll", n)
	}
}

func TestWaitForSuccess(t *testing.T) {
	var calls atomic.Int32
	fake := runFake(t, func(tb testing.TB) {
		pgtest.WaitFor(tb, 10*time.Second, "third call", func() bool {
			return calls.Add(1) == 3
		})
	})
	if fake.Failed() {
		t.Fatalf("WaitFor failed: %s", fake)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}
}

func TestTemplateErrors(t *testing.T) {
	fake := runFake(t, func(tb testing.TB) {
		pgtest.Template(tb, "Bad-Name", func(context.Context, string) error { return nil })
	})
	if !strings.Contains(fake.String(), `template name "Bad-Name"`) {
		t.Errorf("bad name not rejected: %q", fake)
	}

	prepareErr := func(context.Context, string) error { return fmt.Errorf("boom") }
	for range 2 { // the failure is remembered
		fake = runFake(t, func(tb testing.TB) { pgtest.Template(tb, "pgtest_failing", prepareErr) })
		if !strings.Contains(fake.String(), "boom") {
			t.Errorf("prepare error not reported: %q", fake)
		}
	}
}
