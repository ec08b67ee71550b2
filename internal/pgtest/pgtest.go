package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgcluster"
)

// EnvDatabaseURL names the environment variable that points the tests at an
// existing server instead of a throwaway cluster. Its value is a postgres://
// URL of a user allowed to create databases; its database (default
// "postgres") is the one Server returns.
const EnvDatabaseURL = "PGEVENTS_TEST_DATABASE_URL"

const (
	// tempPrefix starts the name of the directory of each throwaway cluster.
	tempPrefix = "pgevents-test-"
	// ownerFile, inside that directory, holds the test process's PID, so
	// that a later Main can remove directories whose owner died.
	ownerFile = "pgtest.pid"
	// maxIdent is PostgreSQL's limit on identifier length in bytes.
	maxIdent = 63
	// suffixLen is the length of the random hex suffix of database names.
	suffixLen = 8
	// opTimeout bounds one CREATE or DROP DATABASE, including retries.
	opTimeout = 60 * time.Second
	// templateTimeout bounds a template's preparation.
	templateTimeout = 10 * time.Minute
	// idleTimeout bounds the wait for prepare's sessions to disconnect.
	idleTimeout = 10 * time.Second
	// pollInterval is how often WaitFor and the retry loops poll.
	pollInterval = 5 * time.Millisecond
)

// The shared server, set up by Main before any test runs.
var (
	serverURL string
	admin     *pgxpool.Pool
)

// Templates prepared by this process, by the name given to Template.
var (
	templatesMu sync.Mutex
	templates   = map[string]*tmpl{}
	// procSuffix makes template database names unique to this process, so
	// that test binaries sharing a server do not trample each other's.
	procSuffix = randomHex()
)

type tmpl struct {
	dbname string
	done   chan struct{} // closed when preparation ended; err is then set
	err    error
}

// Main runs a package's tests against one shared server and exits with the
// tests' status. Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// If PGEVENTS_TEST_DATABASE_URL is set, the tests use that server. Otherwise
// Main starts a throwaway cluster (fsync, synchronous_commit and
// full_page_writes off) in a new directory under os.TempDir(), and stops it
// and removes the directory after the tests. If the server cannot be
// reached or started (for instance because the PostgreSQL binaries are not
// installed), Main prints why, and how to fix it, to stderr and exits with
// status 1.
//
// A log line written after its test ended that breaks the rules of the
// logs (logtest.Check) fails the run too.
func Main(m *testing.M) {
	code := run(m)
	if late := logtest.Late(); len(late) > 0 {
		for _, p := range late {
			fmt.Fprintf(os.Stderr, "logtest: %s\n", p)
		}
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func run(m *testing.M) int {
	ctx := context.Background()
	if u := os.Getenv(EnvDatabaseURL); u != "" {
		code, err := runExternal(ctx, m, u)
		if err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %s: %v\n", EnvDatabaseURL, err)
			return 1
		}
		return code
	}

	sweepStaleDirs()
	dir, err := os.MkdirTemp("", tempPrefix)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		return 1
	}
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{
		Dir: dir,
		Settings: map[string]string{
			"fsync":              "off",
			"synchronous_commit": "off",
			"full_page_writes":   "off",
		},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: cannot start a throwaway PostgreSQL server: %v\n"+
			"pgtest: (alternatively, set %s to the URL of an existing server)\n", err, EnvDatabaseURL)
		return 1
	}
	defer func() {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: stop server: %v\n", err)
		}
	}()
	if err := setServer(ctx, cluster.URL("postgres")); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		return 1
	}
	code := m.Run()
	runExampleCleanups()
	admin.Close()
	return code
}

// runExternal runs the tests against the server at rawURL and drops the
// templates they made (their databases drop themselves).
func runExternal(ctx context.Context, m *testing.M, rawURL string) (int, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0, fmt.Errorf("not a URL: %w", err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return 0, fmt.Errorf("want a postgres:// URL, got scheme %q", u.Scheme)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/postgres"
	}
	if err := setServer(ctx, u.String()); err != nil {
		return 0, err
	}

	code := m.Run()
	runExampleCleanups()
	dropTemplates()
	admin.Close()
	return code, nil
}

// setServer connects the admin pool to adminURL.
func setServer(ctx context.Context, adminURL string) error {
	pool, err := pgxpool.New(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", redact(adminURL), err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return fmt.Errorf("connect to %s: %w", redact(adminURL), err)
	}
	serverURL, admin = adminURL, pool
	return nil
}

func dropTemplates() {
	templatesMu.Lock()
	defer templatesMu.Unlock()
	for name, tpl := range templates {
		<-tpl.done
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		if err := dropDB(ctx, tpl.dbname); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: drop template %q: %v\n", name, err)
		}
		cancel()
	}
}

// sweepStaleDirs removes throwaway cluster directories whose test process
// died without cleaning up, once their server has shut down too.
func sweepStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*"))
	for _, dir := range dirs {
		if !pidFileDead(filepath.Join(dir, ownerFile)) {
			continue
		}
		pm := filepath.Join(dir, "data", "postmaster.pid")
		if _, err := os.Stat(pm); err == nil && !pidFileDead(pm) {
			continue
		}
		_ = os.RemoveAll(dir)
	}
}

// pidFileDead reports whether the file's first line is the PID of a process
// that no longer exists.
func pidFileDead(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return false
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// Server returns the URL of the shared server's administrative database
// ("postgres" unless PGEVENTS_TEST_DATABASE_URL names another). It fails the
// test if the package's TestMain does not call Main.
func Server(tb testing.TB) string {
	tb.Helper()
	if serverURL == "" {
		tb.Fatal("pgtest: no server; the package needs: func TestMain(m *testing.M) { pgtest.Main(m) }")
	}
	return serverURL
}

// NewDB creates a fresh, empty database for the test, named after it, drops
// it when the test and its subtests have finished, and returns its URL. It
// is safe to call from parallel tests.
func NewDB(tb testing.TB) string {
	tb.Helper()
	return createDB(tb, "template0")
}

// NewDBFrom is like NewDB, but the new database is a copy of the database
// template, typically one prepared by Template (either the name passed to
// Template or the one it returned may be given).
func NewDBFrom(tb testing.TB, template string) string {
	tb.Helper()
	Server(tb)
	templatesMu.Lock()
	tpl := templates[template]
	templatesMu.Unlock()
	if tpl != nil {
		template = tpl.wait(tb, template)
	}
	return createDB(tb, template)
}

// Template returns the name of a template database prepared for this test
// binary: the first call with a given name creates an empty database and
// runs prepare on it with its URL; later and concurrent calls wait for that
// and return the same database. prepare must close its connections before
// returning. name must be lowercase letters, digits and underscores, at
// most 54 bytes. The database is called name plus a suffix unique to this
// process, so that test binaries sharing a server do not collide; pass the
// returned name (or name itself) to NewDBFrom. If prepare fails, every call
// with that name fails the calling test.
func Template(tb testing.TB, name string, prepare func(ctx context.Context, url string) error) string {
	tb.Helper()
	Server(tb)
	if !validTemplateName.MatchString(name) || len(name) > maxIdent-1-suffixLen {
		tb.Fatalf("pgtest: template name %q: want [a-z_][a-z0-9_]*, at most %d bytes", name, maxIdent-1-suffixLen)
	}
	templatesMu.Lock()
	tpl, ok := templates[name]
	if !ok {
		tpl = &tmpl{dbname: name + "_" + procSuffix, done: make(chan struct{})}
		templates[name] = tpl
	}
	templatesMu.Unlock()
	if !ok {
		tpl.prepare(prepare)
	}
	return tpl.wait(tb, name)
}

var validTemplateName = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// prepare creates the template database and runs prepareFn on it.
func (tpl *tmpl) prepare(prepareFn func(ctx context.Context, url string) error) {
	returned := false
	defer func() {
		if !returned {
			tpl.err = errors.New("prepare did not return (it panicked or called runtime.Goexit, as FailNow does)")
		}
		close(tpl.done)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), templateTimeout)
	defer cancel()
	tpl.err = buildTemplate(ctx, tpl.dbname, prepareFn)
	returned = true
}

func buildTemplate(ctx context.Context, dbname string, prepare func(ctx context.Context, url string) error) (err error) {
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident(dbname)+" TEMPLATE template0"); err != nil {
		return fmt.Errorf("create database %s: %w", dbname, err)
	}
	defer func() {
		if err != nil {
			dropCtx, cancel := context.WithTimeout(context.Background(), opTimeout)
			defer cancel()
			_ = dropDB(dropCtx, dbname)
		}
	}()
	if err := prepare(ctx, dbURL(dbname)); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	// A client's disconnection ends its server process asynchronously, so
	// give prepare's sessions a moment to go away.
	waitCtx, cancel := context.WithTimeout(ctx, idleTimeout)
	defer cancel()
	for {
		var n int
		err := admin.QueryRow(waitCtx, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", dbname).Scan(&n)
		if err == nil && n == 0 {
			break
		}
		if err == nil {
			err = fmt.Errorf("%d session(s) still connected", n)
		}
		if pause(waitCtx) != nil {
			return fmt.Errorf("prepare left connections open to the template (close them before returning): %w", err)
		}
	}
	// No one has any business connecting to the template from now on, and a
	// session would make CREATE DATABASE ... TEMPLATE fail.
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+ident(dbname)+" WITH ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("alter database %s: %w", dbname, err)
	}
	return nil
}

// wait blocks until the template is prepared and returns its database name,
// failing the test if preparation failed.
func (tpl *tmpl) wait(tb testing.TB, name string) string {
	tb.Helper()
	select {
	case <-tpl.done:
	case <-tb.Context().Done():
		tb.Fatalf("pgtest: test ended while waiting for template %q", name)
	}
	if tpl.err != nil {
		tb.Fatalf("pgtest: template %q: %v", name, tpl.err)
	}
	return tpl.dbname
}

// createDB creates a database for tb from template and schedules its drop.
func createDB(tb testing.TB, template string) string {
	tb.Helper()
	Server(tb)
	ctx, cancel := context.WithTimeout(tb.Context(), opTimeout)
	defer cancel()
	name := dbName(tb.Name())
	for {
		_, err := admin.Exec(ctx, "CREATE DATABASE "+ident(name)+" TEMPLATE "+ident(template))
		if err == nil {
			break
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			switch pgErr.Code {
			case "42P04": // duplicate_database: the random suffix collided
				name = dbName(tb.Name())
				continue
			case "55006": // object_in_use: someone is connected to the template
				if pause(ctx) == nil {
					continue
				}
			}
		}
		tb.Fatalf("pgtest: create database %s from %s: %v", name, template, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := dropDB(ctx, name); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return dbURL(name)
}

func dropDB(ctx context.Context, name string) error {
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// Pool returns a connection pool for url, closed when the test and its
// subtests have finished. It fails the test if the database cannot be
// reached.
func Pool(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), opTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		tb.Fatalf("pgtest: pool for %s: %v", redact(url), err)
	}
	tb.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		tb.Fatalf("pgtest: connect to %s: %v", redact(url), err)
	}
	return pool
}

// WaitFor calls cond every few milliseconds until it returns true, and
// fails the test with msg if that has not happened within timeout. Tests
// use it instead of sleeping for a fixed time.
func WaitFor(tb testing.TB, timeout time.Duration, msg string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if cond() {
			return
		}
		if !time.Now().Before(deadline) {
			tb.Fatalf("pgtest: timed out after %s waiting for: %s", timeout, msg)
			return
		}
		<-tick.C
	}
}

// pause waits one poll interval, or returns ctx's error if it ends first.
func pause(ctx context.Context) error {
	t := time.NewTimer(pollInterval)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// dbName derives a database name from a test name: lowercase letters,
// digits and single underscores, cut so that with an underscore and a
// random suffix it fits PostgreSQL's 63 bytes.
func dbName(testName string) string {
	var b strings.Builder
	underscore := true // no leading underscore
	for _, r := range strings.ToLower(testName) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			underscore = false
		} else if !underscore {
			b.WriteByte('_')
			underscore = true
		}
	}
	base := strings.TrimRight(b.String(), "_")
	if base == "" || base[0] >= '0' && base[0] <= '9' {
		base = "t_" + base
	}
	if max := maxIdent - 1 - suffixLen; len(base) > max {
		base = strings.TrimRight(base[:max], "_")
	}
	return base + "_" + randomHex()
}

// randomHex returns suffixLen random hex digits.
func randomHex() string {
	var b [suffixLen / 2]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// dbURL returns the shared server's URL with the database set to name.
func dbURL(name string) string {
	u, err := url.Parse(serverURL)
	if err != nil {
		panic(fmt.Sprintf("pgtest: server URL: %v", err)) // parsed successfully in Main
	}
	u.Path, u.RawPath = "/"+name, ""
	return u.String()
}

// redact hides the password in a URL for messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
