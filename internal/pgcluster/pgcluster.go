package pgcluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// ErrNoBinaries is wrapped by the error FindBinaries and Start return when
// the PostgreSQL server binaries (initdb, postgres) cannot be found.
var ErrNoBinaries = errors.New("pgcluster: PostgreSQL server binaries not found (initdb, postgres)")

// InstallHint is the command that installs the PostgreSQL server binaries on
// Debian and Ubuntu; the error wrapping ErrNoBinaries includes it.
const InstallHint = "sudo apt-get install -y postgresql"

// versionedBinDirs is where FindBinaries looks after PATH; a variable so that
// tests can hide the machine's installation.
var versionedBinDirs = "/usr/lib/postgresql/*/bin"

const (
	// startTimeout bounds the wait for a freshly started server to accept
	// connections.
	startTimeout = 30 * time.Second
	// fastStopTimeout and quitStopTimeout bound how long Stop waits after
	// SIGINT and SIGQUIT before escalating.
	fastStopTimeout = 60 * time.Second
	quitStopTimeout = 10 * time.Second
	// maxSocketDirLen keeps Dir/.s.PGSQL.NNNNN.lock under the 108 bytes of
	// sun_path.
	maxSocketDirLen = 100
	// portAttempts is how many free ports Start tries when Options.Port is 0
	// and the chosen port is taken before postgres binds it.
	portAttempts = 5
	// tailSize is how much of the server's output is kept for error messages.
	tailSize = 4096
)

// Options configures a throwaway cluster.
type Options struct {
	// Dir is the directory that holds the cluster: its data directory
	// (Dir/data), its Unix-domain socket and, unless Log is set, its log
	// (Dir/server.log). It is created if missing. If Dir/data already holds
	// a cluster (PG_VERSION present), that cluster is reused.
	Dir string
	// Port is the TCP port the server listens on at 127.0.0.1; 0 picks a
	// free one.
	Port int
	// Settings are extra postgresql.conf settings, passed to postgres as
	// -c key=value; they override the defaults described at Start.
	Settings map[string]string
	// Log receives the server's log (and initdb's output); nil means a file
	// named server.log inside Dir, appended to.
	Log io.Writer
	// Relocate matters only when the process runs as root, so that the
	// server runs as the "postgres" user, and a directory above Dir is not
	// searchable by that user (a 0700 home, say). Without Relocate, Start
	// then fails with an error naming that directory. With it, Start puts
	// the cluster in a directory that user can reach instead, named after
	// Dir's path under $TMPDIR, /var/tmp or /tmp (the first the user can
	// reach), owned by the user and private to it, and makes Dir a symbolic
	// link to it. Starting again with the same Dir follows the link, or
	// finds the same directory by name, and so reuses the cluster.
	// Cluster.Dir reports where the cluster is.
	Relocate bool
}

// Cluster is a running PostgreSQL server started by Start.
type Cluster struct {
	dir     string
	dataDir string
	port    int
	cmd     *exec.Cmd
	tail    *tailBuffer
	closeFn func() error

	exited  chan struct{} // closed once postgres has exited and been reaped
	waitErr error         // cmd.Wait's result; read only after exited is closed

	stopOnce sync.Once
	stopErr  error
}

// FindBinaries returns the directory that holds the initdb and postgres
// executables, looking on PATH first and then in the highest version under
// /usr/lib/postgresql/*/bin. When they are missing, the error wraps
// ErrNoBinaries and says how to install them.
func FindBinaries() (dir string, err error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		// Prefer the directory the link points into: postgres finds its
		// share directory relative to its real location.
		var cands []string
		if real, err := filepath.EvalSymlinks(p); err == nil {
			cands = append(cands, filepath.Dir(real))
		}
		cands = append(cands, filepath.Dir(p))
		for _, d := range cands {
			if hasBinaries(d) {
				return d, nil
			}
		}
	}
	dirs, _ := filepath.Glob(versionedBinDirs)
	sort.Slice(dirs, func(i, j int) bool {
		return versionLess(filepath.Base(filepath.Dir(dirs[j])), filepath.Base(filepath.Dir(dirs[i])))
	})
	for _, d := range dirs {
		if hasBinaries(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("%w; install them with: %s", ErrNoBinaries, InstallHint)
}

func hasBinaries(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.IsDir() || st.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// versionLess compares dotted version strings such as "9.6" and "15"
// numerically.
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

// Start initialises the cluster in opts.Dir unless one is already there,
// starts postgres listening on 127.0.0.1 and returns once it accepts
// connections (or after 30 seconds, with an error that includes the end of
// the server's log).
//
// initdb runs with trust authentication, the superuser "postgres", UTF8
// encoding and the C.UTF-8 locale (C when that locale is unavailable). The
// server gets these settings, which opts.Settings can override:
// listen_addresses=127.0.0.1, unix_socket_directories=Dir,
// max_connections=400, shared_buffers=128MB, max_prepared_transactions=0,
// log_min_messages=warning, log_destination=stderr and logging_collector=off
// (the log goes to opts.Log). Durability settings keep PostgreSQL's defaults;
// callers that do not care, such as tests, pass fsync=off themselves, in
// which case initdb also skips syncing. The port always comes from
// opts.Port. ctx bounds initialisation and startup only, not the server's
// lifetime: call Stop to shut it down.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Dir == "" {
		return nil, errors.New("pgcluster: Options.Dir is required")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	binDir, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	owner, err := serverUser()
	if err != nil {
		return nil, err
	}
	claimed := false // dir is a relocation directory, already the owner's
	if owner != nil && opts.Relocate {
		if dir, claimed, err = owner.relocate(dir); err != nil {
			return nil, err
		}
	}
	// Directories above dir that are missing are made searchable, for the
	// server user; dir itself is private.
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("pgcluster: create dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pgcluster: create dir: %w", err)
	}
	if owner != nil && !claimed {
		if err := owner.prepareDir(dir); err != nil {
			return nil, err
		}
	}

	var logw io.Writer = opts.Log
	var closeFn func() error
	if logw == nil {
		f, err := os.OpenFile(filepath.Join(dir, "server.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("pgcluster: open server log: %w", err)
		}
		logw, closeFn = f, f.Close
	}
	closeLog := func() {
		if closeFn != nil {
			_ = closeFn()
		}
	}

	dataDir := filepath.Join(dir, "data")
	if _, err := os.Stat(filepath.Join(dataDir, "PG_VERSION")); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			closeLog()
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		if err := initdb(ctx, binDir, dir, dataDir, owner, opts.Settings["fsync"] == "off", logw); err != nil {
			closeLog()
			return nil, err
		}
	} else if owner != nil {
		if err := owner.ensureOwns(dataDir); err != nil {
			closeLog()
			return nil, err
		}
	}

	attempts := 1
	if opts.Port == 0 {
		attempts = portAttempts
	}
	for attempt := 1; ; attempt++ {
		port := opts.Port
		if port == 0 {
			if port, err = freePort(); err != nil {
				closeLog()
				return nil, err
			}
		}
		c := &Cluster{
			dir:     dir,
			dataDir: dataDir,
			port:    port,
			tail:    &tailBuffer{},
			closeFn: closeFn,
			exited:  make(chan struct{}),
		}
		err := c.launch(ctx, binDir, owner, settings(dir, port, opts.Settings), logw)
		if err == nil {
			return c, nil
		}
		if errors.Is(err, errPortInUse) && attempt < attempts {
			continue
		}
		closeLog()
		return nil, err
	}
}

// URL returns a connection URL for database dbname as the superuser
// "postgres" over TCP, for example
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable.
func (c *Cluster) URL(dbname string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, url.PathEscape(dbname))
}

// Port returns the TCP port the server listens on at 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// Dir returns the absolute path of the cluster's directory: Options.Dir,
// or the directory Options.Relocate chose instead.
func (c *Cluster) Dir() string { return c.dir }

// DataDir returns the absolute path of the cluster's data directory,
// Dir()/data.
func (c *Cluster) DataDir() string { return c.dataDir }

// Stop shuts the server down with a fast shutdown (SIGINT: active
// transactions are rolled back, clients disconnected, a checkpoint written)
// and waits for it to exit, escalating to SIGQUIT and then SIGKILL if it does
// not exit within a minute. Calling Stop again returns the first call's
// result.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.stopErr = c.stop()
		if c.closeFn != nil {
			if err := c.closeFn(); err != nil && c.stopErr == nil {
				c.stopErr = fmt.Errorf("pgcluster: close server log: %w", err)
			}
		}
	})
	return c.stopErr
}

func (c *Cluster) stop() error {
	select {
	case <-c.exited:
		if c.waitErr != nil {
			return fmt.Errorf("pgcluster: postgres had already exited: %w\n%s", c.waitErr, c.tail)
		}
		return nil
	default:
	}
	pid := c.cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGINT)
	if c.waitExit(fastStopTimeout) {
		return c.exitErr("fast shutdown")
	}
	_ = syscall.Kill(pid, syscall.SIGQUIT)
	if c.waitExit(quitStopTimeout) {
		return fmt.Errorf("pgcluster: postgres ignored fast shutdown for %s; stopped it with SIGQUIT", fastStopTimeout)
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL) // the whole process group
	<-c.exited
	return fmt.Errorf("pgcluster: postgres ignored SIGINT and SIGQUIT; killed it")
}

func (c *Cluster) waitExit(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.exited:
		return true
	case <-t.C:
		return false
	}
}

func (c *Cluster) exitErr(what string) error {
	if c.waitErr != nil {
		return fmt.Errorf("pgcluster: postgres %s: %w\n%s", what, c.waitErr, c.tail)
	}
	return nil
}

var errPortInUse = errors.New("pgcluster: port already in use")

// launch starts postgres and waits until it accepts connections.
func (c *Cluster) launch(ctx context.Context, binDir string, owner *osUser, settings []string, logw io.Writer) error {
	args := []string{"-D", c.dataDir}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	cmd := exec.Command(filepath.Join(binDir, "postgres"), args...)
	cmd.Dir = c.dir
	out := &fanout{log: logw, tail: c.tail}
	cmd.Stdout, cmd.Stderr = out, out // same writer: one pipe, one copying goroutine
	cmd.SysProcAttr = sysProcAttr(owner.credential())
	c.cmd = cmd

	// Fork from a goroutine locked to its thread, and keep that thread alive
	// until postgres exits, so that Pdeathsig fires only when this process
	// dies (see the package documentation).
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(c.exited)
			return
		}
		started <- nil
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("pgcluster: start postgres: %w", err)
	}

	if err := c.waitReady(ctx); err != nil {
		// Startup failed or timed out: stop what is left without delay.
		pid := cmd.Process.Pid
		select {
		case <-c.exited:
		default:
			_ = syscall.Kill(pid, syscall.SIGQUIT)
			if !c.waitExit(quitStopTimeout) {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
				<-c.exited
			}
		}
		return err
	}
	return nil
}

// waitReady polls until the server accepts a connection, it exits, ctx is
// done or startTimeout passes.
func (c *Cluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	cfg, err := pgx.ParseConfig(c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	cfg.ConnectTimeout = 2 * time.Second
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := c.ping(ctx, cfg)
		if err == nil {
			return nil
		}
		select {
		case <-c.exited:
			out := c.tail.String()
			if strings.Contains(out, "could not bind") || strings.Contains(out, "could not create any TCP/IP sockets") {
				return fmt.Errorf("%w: %d\n%s", errPortInUse, c.port, out)
			}
			return fmt.Errorf("pgcluster: postgres exited during startup (%v):\n%s", c.waitErr, out)
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: postgres did not accept connections on port %d: %w (last error: %v)\n%s", c.port, ctx.Err(), err, c.tail)
		case <-tick.C:
		}
	}
}

// ping connects once and checks that the server that answered is this
// cluster's: until our postmaster has failed to bind a port that another
// server already holds, a connection to that port reaches the other server.
func (c *Cluster) ping(ctx context.Context, cfg *pgx.ConnConfig) error {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var dataDir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err != nil {
		return err
	}
	if filepath.Clean(dataDir) != c.dataDir {
		return fmt.Errorf("pgcluster: port %d is served by another cluster (%s)", c.port, dataDir)
	}
	// Same data directory: make sure it is our postmaster that holds it, not
	// one started earlier on the same directory and port.
	b, err := os.ReadFile(filepath.Join(c.dataDir, "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if pid, _, _ := strings.Cut(string(b), "\n"); strings.TrimSpace(pid) != strconv.Itoa(c.cmd.Process.Pid) {
		return fmt.Errorf("pgcluster: %s is already served by postmaster %s", c.dataDir, strings.TrimSpace(pid))
	}
	return nil
}

func settings(dir string, port int, extra map[string]string) []string {
	m := map[string]string{
		"listen_addresses":          "127.0.0.1",
		"unix_socket_directories":   dir,
		"max_connections":           "400",
		"shared_buffers":            "128MB",
		"max_prepared_transactions": "0",
		"log_min_messages":          "warning",
		"log_destination":           "stderr",
		"logging_collector":         "off",
	}
	if len(dir) > maxSocketDirLen || strings.ContainsAny(dir, `, "'\`) {
		m["unix_socket_directories"] = "" // TCP only
	}
	for k, v := range extra {
		m[k] = v
	}
	m["port"] = strconv.Itoa(port)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+m[k])
	}
	return out
}

func initdb(ctx context.Context, binDir, dir, dataDir string, owner *osUser, noSync bool, logw io.Writer) error {
	var lastErr error
	for _, locale := range []string{"C.UTF-8", "C"} {
		args := []string{"-D", dataDir, "--auth=trust", "-U", "postgres", "--encoding=UTF8", "--locale=" + locale}
		if noSync {
			args = append(args, "--no-sync")
		}
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"), args...)
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: owner.credential()}
		out, err := cmd.CombinedOutput()
		_, _ = logw.Write(out)
		if err == nil {
			return nil
		}
		lastErr = fmt.Errorf("pgcluster: initdb: %w\n%s", err, out)
		if !bytes.Contains(out, []byte("locale")) {
			break
		}
	}
	return lastErr
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: pick a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// osUser is the unprivileged user the server runs as when we are root.
type osUser struct {
	name   string
	uid    uint32
	gid    uint32
	groups []uint32
}

// serverUser returns the "postgres" system user when running as root and nil
// otherwise.
func serverUser() (*osUser, error) {
	if os.Getuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root, and PostgreSQL refuses to, but there is no \"postgres\" user to run it as (installing PostgreSQL creates it: %s): %w", InstallHint, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgcluster: user postgres: %w", err)
	}
	o := &osUser{name: u.Username, uid: uint32(uid), gid: uint32(gid)}
	ids, _ := u.GroupIds()
	for _, id := range ids {
		if g, err := strconv.ParseUint(id, 10, 32); err == nil {
			o.groups = append(o.groups, uint32(g))
		}
	}
	return o, nil
}

// credential returns the credential to run a child as; nil (the current
// user) when o is nil.
func (o *osUser) credential() *syscall.Credential {
	if o == nil {
		return nil
	}
	return &syscall.Credential{Uid: o.uid, Gid: o.gid, Groups: o.groups}
}

// prepareDir makes dir the user's and checks that the user can reach it.
func (o *osUser) prepareDir(dir string) error {
	if err := os.Chown(dir, int(o.uid), int(o.gid)); err != nil {
		return fmt.Errorf("pgcluster: chown %s to %s: %w", dir, o.name, err)
	}
	blocked, err := o.blockedAncestor(dir)
	if err != nil {
		return err
	}
	if blocked != "" {
		return fmt.Errorf("pgcluster: directory %s is not searchable by user %s, who runs the server because PostgreSQL refuses to run as root; "+
			"use a directory under %s (os.MkdirTemp), set Options.Relocate, or run: chmod o+x %s", blocked, o.name, os.TempDir(), blocked)
	}
	return nil
}

// blockedAncestor returns the first directory above path that the user
// cannot search, or "" when the user can reach path. Directories that do
// not exist yet do not count: Start creates them searchable.
func (o *osUser) blockedAncestor(path string) (string, error) {
	for p := filepath.Dir(path); ; p = filepath.Dir(p) {
		ok, err := o.canSearch(p)
		if errors.Is(err, fs.ErrNotExist) {
			ok, err = true, nil
		}
		if err != nil {
			return "", fmt.Errorf("pgcluster: %w", err)
		}
		if !ok {
			return p, nil
		}
		if p == filepath.Dir(p) {
			return "", nil
		}
	}
}

// relocationBases returns the directories, in order of preference, under
// which relocate may put a cluster: $TMPDIR when set, then /var/tmp (kept
// across reboots, unlike /tmp on many systems), then /tmp. A variable so
// that tests can use their own.
var relocationBases = func() []string {
	var bases []string
	if d := os.Getenv("TMPDIR"); d != "" {
		bases = append(bases, d)
	}
	return append(bases, "/var/tmp", "/tmp")
}

// relocate returns the directory that holds the cluster requested at dir
// (see Options.Relocate): dir itself when the user can reach it; the
// directory a symbolic link at dir points to, when the user can reach
// that; otherwise a directory under a relocation base, named after dir,
// which it creates or checks and to which it links dir. claimed reports
// that the result is such a relocation directory, already made the user's
// (by claim).
func (o *osUser) relocate(dir string) (_ string, claimed bool, _ error) {
	blocked, err := o.blockedAncestor(dir)
	if err != nil || blocked == "" {
		return dir, false, err
	}
	fi, err := os.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return "", false, fmt.Errorf("pgcluster: %w", err)
	case fi.Mode()&fs.ModeSymlink != 0:
		link, err := os.Readlink(dir)
		if err != nil {
			return "", false, fmt.Errorf("pgcluster: %w", err)
		}
		if filepath.IsAbs(link) && filepath.Base(link) == relocationName(dir) {
			// A link made by an earlier Start: check the directory again,
			// as it sits in a shared directory.
			if _, err := os.Lstat(link); err == nil {
				if b, err := o.blockedAncestor(link); err != nil || b != "" {
					return "", false, fmt.Errorf("pgcluster: %s links to %s, which user %s cannot reach either (%s is not searchable); remove the link", dir, link, o.name, b)
				}
				if err := o.claim(link); err != nil {
					return "", false, err
				}
				return link, true, nil
			}
		} else if target, err := filepath.EvalSymlinks(dir); err == nil {
			// A link made by someone else, in a directory only root can
			// write: use its target if the user can reach it.
			if b, err := o.blockedAncestor(target); err != nil || b == "" {
				return target, false, err
			}
			return "", false, fmt.Errorf("pgcluster: %s links to %s, which user %s cannot reach either (%s is not searchable); remove the link", dir, target, o.name, blocked)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", false, fmt.Errorf("pgcluster: %w", err)
		}
		// The link's target is gone (a reboot emptied /tmp, say): start
		// afresh.
		if err := os.Remove(dir); err != nil {
			return "", false, fmt.Errorf("pgcluster: remove dangling link: %w", err)
		}
	case fi.IsDir():
		// Only an empty directory can give way to the link.
		if err := os.Remove(dir); err != nil {
			return "", false, fmt.Errorf("pgcluster: directory %s is not searchable by user %s, who runs the server because PostgreSQL refuses to run as root, "+
				"and %s cannot be replaced by a link to a directory that user can reach because it is not empty; move its contents away or run: chmod o+x %s", blocked, o.name, dir, blocked)
		}
	default:
		return "", false, fmt.Errorf("pgcluster: %s exists and is not a directory; remove it", dir)
	}

	target, err := o.relocationDir(dir)
	if err != nil {
		return "", false, err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", false, fmt.Errorf("pgcluster: create dir: %w", err)
	}
	if err := os.Symlink(target, dir); err != nil {
		return "", false, fmt.Errorf("pgcluster: link %s to %s: %w", dir, target, err)
	}
	return target, true, nil
}

// relocationDir creates, or checks and reuses, the directory named after
// dir under the first relocation base the user can reach, and makes it the
// user's with mode 0700.
func (o *osUser) relocationDir(dir string) (string, error) {
	var tried []string
	for _, base := range relocationBases() {
		st, err := os.Stat(base)
		if err != nil || !st.IsDir() {
			continue
		}
		tried = append(tried, base)
		if ok, err := o.canSearch(base); err != nil || !ok {
			continue
		}
		if b, err := o.blockedAncestor(base); err != nil || b != "" {
			continue
		}
		p := filepath.Join(base, relocationName(dir))
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("pgcluster: %w", err)
		}
		if err := o.claim(p); err != nil {
			return "", err
		}
		return p, nil
	}
	return "", fmt.Errorf("pgcluster: user %s, who runs the server because PostgreSQL refuses to run as root, can reach neither %s nor any of %s; "+
		"set TMPDIR to a directory it can reach", o.name, dir, strings.Join(tried, ", "))
}

// claim makes the relocation directory p the user's, with mode 0700. Its
// name is predictable and its parent shared, so it is opened without
// following a symbolic link, and refused unless root or the user owns it.
func (o *osUser) claim(p string) error {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: %s is not a directory; remove it: %w", p, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || (sys.Uid != 0 && sys.Uid != o.uid) {
		return fmt.Errorf("pgcluster: %s belongs to neither root nor %s; remove it", p, o.name)
	}
	if err := f.Chown(int(o.uid), int(o.gid)); err != nil {
		return fmt.Errorf("pgcluster: chown %s to %s: %w", p, o.name, err)
	}
	if err := f.Chmod(0o700); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

// relocationName names the directory that holds a relocated cluster: the
// last two elements of dir, for people, and a hash of the whole path, so
// that each requested directory has its own.
func relocationName(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	readable := strings.Map(func(r rune) rune {
		if r < utf8.RuneSelf && (r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r)) {
			return r
		}
		return '-'
	}, filepath.Base(filepath.Dir(dir))+"-"+filepath.Base(dir))
	readable = strings.Trim(readable, "-")
	if len(readable) > 40 {
		readable = readable[len(readable)-40:]
	}
	return "pgcluster-" + readable + "-" + hex.EncodeToString(sum[:6])
}

func (o *osUser) canSearch(path string) (bool, error) {
	st, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	perm := st.Mode().Perm()
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return perm&0o001 != 0, nil
	}
	switch {
	case sys.Uid == o.uid:
		return perm&0o100 != 0, nil
	case sys.Gid == o.gid || slices.Contains(o.groups, sys.Gid):
		return perm&0o010 != 0, nil
	default:
		return perm&0o001 != 0, nil
	}
}

// ensureOwns chowns a reused data directory to the user if it is not
// already theirs.
func (o *osUser) ensureOwns(dataDir string) error {
	st, err := os.Stat(dataDir)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Uid == o.uid {
		return nil
	}
	err = filepath.WalkDir(dataDir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(o.uid), int(o.gid))
	})
	if err != nil {
		return fmt.Errorf("pgcluster: chown %s to %s: %w", dataDir, o.name, err)
	}
	return nil
}

// fanout copies the server's output to the log and to the tail buffer. It
// never fails: a failing log writer must not stop the copying, or postgres
// would block on a full pipe.
type fanout struct {
	log  io.Writer
	tail *tailBuffer
}

func (f *fanout) Write(p []byte) (int, error) {
	_, _ = f.tail.Write(p)
	_, _ = f.log.Write(p)
	return len(p), nil
}

// tailBuffer keeps the last tailSize bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*tailSize {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-tailSize:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	if len(b) > tailSize {
		b = b[len(b)-tailSize:]
	}
	return string(b)
}
