package pgcluster_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgcluster"
)

// tempDir returns a fresh directory that the "postgres" user can reach when
// the test runs as root: t.TempDir's parent is private to root, a directory
// made by os.MkdirTemp in the system temporary directory is not.
func tempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgcluster-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	return dir
}

func start(t *testing.T, opts pgcluster.Options) *pgcluster.Cluster {
	t.Helper()
	c, err := pgcluster.Start(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

func exec1(t *testing.T, c *pgcluster.Cluster, sql string) int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), c.URL("postgres"))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestStartStopRestart(t *testing.T) {
	parent := tempDir(t)
	if err := os.Chmod(parent, 0o755); err != nil { // searchable by the postgres user when root
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "cluster") // created by Start
	opts := pgcluster.Options{Dir: dir, Settings: map[string]string{"fsync": "off"}}

	c := start(t, opts)
	if c.Port() == 0 {
		t.Fatal("Port() = 0")
	}
	if got, want := c.URL("postgres"), "postgres://postgres@127.0.0.1:"; !strings.HasPrefix(got, want) {
		t.Fatalf("URL = %q, want prefix %q", got, want)
	}
	if n := exec1(t, c, "SELECT 1"); n != 1 {
		t.Fatalf("SELECT 1 = %d", n)
	}
	// Leave something behind to find after the restart.
	conn, err := pgx.Connect(t.Context(), c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	// A connection still open at Stop must not prevent a fast shutdown.
	if err := c.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := c.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	_ = conn.Close(context.Background())
	if _, err := os.Stat(filepath.Join(c.DataDir(), "PG_VERSION")); err != nil {
		t.Fatalf("data directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "server.log")); err != nil {
		t.Fatalf("server log: %v", err)
	}

	// Restart on the same directory: the cluster is reused, not re-created.
	log := logtest.New(t)
	opts.Log = log
	c2 := start(t, opts)
	if n := exec1(t, c2, "SELECT v FROM kept"); n != 42 {
		t.Fatalf("after restart, kept.v = %d, want 42", n)
	}
	if n := exec1(t, c2, "SELECT current_setting('max_connections')::int"); n != 400 {
		t.Fatalf("max_connections = %d, want 400", n)
	}
	if err := c2.Stop(); err != nil {
		t.Fatalf("Stop after restart: %v", err)
	}
	if strings.Contains(log.String(), "initdb") {
		t.Errorf("restart ran initdb again; log:\n%s", log)
	}
}

func TestSettingsOverrideDefaults(t *testing.T) {
	c := start(t, pgcluster.Options{
		Dir:      tempDir(t),
		Settings: map[string]string{"fsync": "off", "max_connections": "50"},
	})
	if n := exec1(t, c, "SELECT current_setting('max_connections')::int"); n != 50 {
		t.Fatalf("max_connections = %d, want 50", n)
	}
	if n := exec1(t, c, "SELECT (current_setting('fsync') = 'off')::int"); n != 1 {
		t.Fatal("fsync setting not applied")
	}
}

func TestFixedPortInUse(t *testing.T) {
	c := start(t, pgcluster.Options{Dir: tempDir(t), Settings: map[string]string{"fsync": "off"}})
	_, err := pgcluster.Start(t.Context(), pgcluster.Options{
		Dir:      tempDir(t),
		Port:     c.Port(),
		Settings: map[string]string{"fsync": "off"},
	})
	if err == nil {
		t.Fatal("second cluster on the same port started")
	}
	t.Logf("expected error: %v", err)
	if !strings.Contains(err.Error(), "pgcluster:") {
		t.Errorf("error lacks prefix: %v", err)
	}
}

func TestSameDirTwice(t *testing.T) {
	opts := pgcluster.Options{Dir: tempDir(t), Settings: map[string]string{"fsync": "off"}}
	c := start(t, opts)
	for _, port := range []int{0, c.Port()} {
		opts.Port = port
		c2, err := pgcluster.Start(t.Context(), opts)
		if err == nil {
			_ = c2.Stop()
			t.Fatalf("second cluster on the same directory (port %d) started", port)
		}
		t.Logf("expected error: %v", err)
	}
	if n := exec1(t, c, "SELECT 1"); n != 1 {
		t.Fatal("first cluster no longer usable")
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
}

func TestFindBinaries(t *testing.T) {
	dir, err := pgcluster.FindBinaries()
	if err != nil {
		t.Fatalf("FindBinaries: %v", err)
	}
	for _, name := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Error(err)
		}
	}
}

// TestParentDeathStopsServer kills a process that started a cluster, without
// giving it a chance to call Stop, and checks that the server shuts itself
// down (the parent-death signal documented in the package comment).
func TestParentDeathStopsServer(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("parent-death signal is Linux-only")
	}
	dir := tempDir(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStartAndHang$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGCLUSTER_HELPER_DIR="+dir)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "READY" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper did not start a cluster: %q, %v", line, err)
	}
	pidFile := filepath.Join(dir, "data", "postmaster.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // only if the test failed

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	// postgres removes postmaster.pid at the end of a clean shutdown.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(pidFile); errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("postgres (pid %d) still running 30s after its parent was killed", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHelperStartAndHang is run by TestParentDeathStopsServer in a child
// process: it starts a cluster, reports READY and waits to be killed.
func TestHelperStartAndHang(t *testing.T) {
	dir := os.Getenv("PGCLUSTER_HELPER_DIR")
	if dir == "" {
		t.Skip("helper for TestParentDeathStopsServer")
	}
	if _, err := pgcluster.Start(t.Context(), pgcluster.Options{Dir: dir, Settings: map[string]string{"fsync": "off"}}); err != nil {
		t.Fatal(err)
	}
	fmt.Println("READY")
	select {}
}

// TestRelocateFromPrivateDir starts, as root, a cluster asked for inside a
// directory private to root (a 0700 home, the usual case in containers):
// without Options.Relocate Start says which directory is in the way; with
// it the cluster comes up where the postgres user can reach it, the
// requested directory links there, and a restart reuses the cluster.
func TestRelocateFromPrivateDir(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: only then does the server run as the postgres user, who may not reach a directory")
	}
	pg, err := user.Lookup("postgres")
	if err != nil {
		t.Fatal(err)
	}
	private := tempDir(t)
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	requested := filepath.Join(private, "repo", ".pgevents-demo", "pg")
	opts := pgcluster.Options{Dir: requested, Settings: map[string]string{"fsync": "off"}}

	_, err = pgcluster.Start(t.Context(), opts)
	if err == nil || !strings.Contains(err.Error(), "directory "+private+" is not searchable by user postgres") {
		t.Fatalf("without Relocate: err = %v, want it to name %s", err, private)
	}

	opts.Relocate = true
	var relocated string
	t.Cleanup(func() { // after the Stop registered by start
		if relocated != "" {
			_ = os.RemoveAll(relocated)
		}
	})
	c := start(t, opts)
	relocated = c.Dir()
	if relocated == requested || strings.HasPrefix(relocated, private+"/") {
		t.Fatalf("Dir() = %s: not relocated out of %s", relocated, private)
	}
	if link, err := os.Readlink(requested); err != nil || link != relocated {
		t.Fatalf("%s links to %q (%v), want %s", requested, link, err, relocated)
	}
	st, err := os.Stat(relocated)
	if err != nil {
		t.Fatal(err)
	}
	if uid := strconv.Itoa(int(st.Sys().(*syscall.Stat_t).Uid)); uid != pg.Uid || st.Mode().Perm() != 0o700 {
		t.Fatalf("%s: uid %s, mode %v; want the postgres user's (%s), 0700", relocated, uid, st.Mode().Perm(), pg.Uid)
	}
	// The server, running as postgres, reports the data directory it uses.
	conn, err := pgx.Connect(t.Context(), c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	var dataDir string
	if err := conn.QueryRow(t.Context(), "SHOW data_directory").Scan(&dataDir); err != nil {
		t.Fatal(err)
	}
	if dataDir != c.DataDir() || filepath.Dir(dataDir) != relocated {
		t.Fatalf("data_directory = %s, DataDir() = %s, want both under %s", dataDir, c.DataDir(), relocated)
	}
	if _, err := conn.Exec(t.Context(), "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(context.Background())
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}

	c2 := start(t, opts)
	if c2.Dir() != relocated {
		t.Fatalf("restart: Dir() = %s, want %s", c2.Dir(), relocated)
	}
	if n := exec1(t, c2, "SELECT v FROM kept"); n != 7 {
		t.Fatalf("after restart, kept.v = %d, want 7", n)
	}
	if err := c2.Stop(); err != nil {
		t.Fatal(err)
	}
}
