// Package pgtest gives tests a real PostgreSQL database in one line.
//
// pgevents turns PostgreSQL into an event log, and what it relies on (row
// locks, SKIP LOCKED, LISTEN/NOTIFY, transaction visibility) cannot be
// mocked faithfully, so its tests always run against a real server. The
// design follows River's riverdbtest: a package's TestMain starts (or finds)
// one server shared by all its tests, and each test gets a database of its
// own, so tests can run in parallel and never see each other's tables.
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		pool := pgtest.Pool(t, pgtest.NewDB(t))
//		...
//	}
//
// # Which server
//
// If the environment variable PGEVENTS_TEST_DATABASE_URL is set (a
// postgres:// URL of a user allowed to create databases), Main uses that
// server: tests create and drop their databases on it. Otherwise Main starts
// a throwaway cluster with package pgcluster in a fresh directory under
// os.TempDir(), with durability turned off (fsync, synchronous_commit and
// full_page_writes off) because nothing in it needs to survive, and stops it
// and removes the directory once the tests have run. Each test binary thus
// has a private server: `go test ./...` runs packages in parallel without
// them meeting. When the PostgreSQL server binaries are missing, Main prints
// pgcluster's error, which says how to install them, and exits with status
// 1: a missing server is a broken setup, never a reason to skip.
//
// When run as root (as in CI containers), pgcluster runs the server as the
// "postgres" system user; the directory Main creates is handed to that user.
//
// If a test binary dies before Main can clean up (a panic, a -timeout, a
// kill), the server shuts itself down (see pgcluster), and the next Main
// removes directories left behind by dead test processes.
//
// # Databases
//
// NewDB creates an empty database named after the test (sanitised, plus a
// random suffix) and drops it, WITH (FORCE), when the test ends. Creating a
// database copies a template in a fraction of a second, so a test that
// needs the pgevents schema should not migrate its own database: it asks
// Template for a template database, prepared once per test binary, and
// clones it with NewDBFrom:
//
//	tpl := pgtest.Template(t, "migrated", func(ctx context.Context, url string) error {
//		conn, err := pgx.Connect(ctx, url)
//		if err != nil {
//			return err
//		}
//		defer conn.Close(ctx)
//		_, err = schema.Migrate(ctx, conn)
//		return err
//	})
//	url := pgtest.NewDBFrom(t, tpl)
//
// CREATE DATABASE ... TEMPLATE refuses to copy a database that has other
// sessions, so Template waits until prepare's connections are gone and then
// forbids new connections to the template, and NewDBFrom retries while the
// server reports SQLSTATE 55006 (source database is being accessed by other
// users).
//
// # Waiting
//
// Tests never sleep for a fixed time: WaitFor polls a condition every few
// milliseconds until it holds, failing the test with a message when its
// timeout expires.
package pgtest
