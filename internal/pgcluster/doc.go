// Package pgcluster starts and stops throwaway PostgreSQL clusters.
//
// pgevents stores its event log in PostgreSQL, so its tests and its
// `consumer demo` and `consumer bench` commands need a real server. Rather
// than depending on a server that happens to be installed and configured on
// the machine, pgcluster creates a private cluster from the PostgreSQL server
// binaries: it runs initdb into a directory, starts the postgres process
// directly on a free port of 127.0.0.1 and waits until it accepts
// connections. Nothing outside that directory is touched, so any number of
// clusters (one per test binary, say) can run side by side.
//
// # Layout
//
// Options.Dir holds everything that belongs to one cluster:
//
//	Dir/data/         the data directory created by initdb (PG_VERSION inside)
//	Dir/server.log    the server's log, unless Options.Log is set
//	Dir/.s.PGSQL.*    the server's Unix-domain socket
//
// If Dir/data already holds a cluster, Start reuses it instead of running
// initdb again, which is how the demo keeps its data between runs. The
// socket is put in Dir only when the resulting path fits the kernel's limit
// for socket paths; otherwise the server listens on TCP only. Clients always
// connect over TCP, using the URL returned by Cluster.URL. Authentication is
// "trust" for the superuser "postgres", so no password is involved.
//
// # Running as root
//
// PostgreSQL refuses to run as root. When the calling process is root,
// initdb and postgres are started as the "postgres" system user (looked up
// with os/user, switched to with syscall.Credential, so neither su nor
// runuser is needed), Dir is chowned to that user, and Start checks that
// every directory above Dir can be searched by it, reporting the offending
// directory otherwise. A directory made with os.MkdirTemp("", ...) satisfies
// this; t.TempDir() does not, because its parent is private to root.
//
// Options.Relocate turns that error into a fallback, for callers such as
// the demo that keep their cluster inside a repository, which as root is
// often under a private home directory. The cluster then lives in a
// directory the "postgres" user can reach, under $TMPDIR, /var/tmp or /tmp,
// named after the requested path (pgcluster-<last two elements>-<hash>),
// owned by that user with mode 0700, and Dir becomes a symbolic link to it:
//
//	/root/src/pgevents/.pgevents-demo/pg -> /var/tmp/pgcluster-pgevents-demo-pg-1a2b3c4d5e6f
//
// Cluster.Dir returns the real location. A later Start with the same Dir
// follows the link (or, if the link is gone, finds the directory by its
// name) and reuses the cluster; if the directory is gone, a new cluster is
// made. Because the name is predictable and the parent shared, Start opens
// that directory without following symbolic links and refuses it unless
// root or the "postgres" user owns it. Removing the requested directory
// does not remove the cluster: remove the link's target too.
//
// # Process lifetime
//
// The postgres process is started directly (not through pg_ctl) in its own
// process group, so a ^C in the terminal reaches only the parent (which
// then calls Stop, or dies and lets the parent-death signal below stop the
// server) instead of racing it, and Stop can signal the postmaster and wait
// for it to exit. Stop requests a fast shutdown (SIGINT), escalating to
// an immediate shutdown (SIGQUIT) and finally SIGKILL if the server does not
// exit in time.
//
// So that a cluster does not outlive a parent that dies without calling Stop
// (a panic, a test timeout, a kill), postgres is started on Linux with the
// parent-death signal (Pdeathsig) set to SIGINT, which asks for a fast
// shutdown. The kernel sends that signal when the thread that forked the
// child exits, not when the process does, and Go may run a goroutine on any
// thread. Start therefore forks postgres from a goroutine locked to its OS
// thread with runtime.LockOSThread, and that goroutine stays alive, waiting
// for the process, until postgres has exited; the thread thus lives exactly
// as long as the parent process or the server. On other systems there is
// no parent-death signal and a cluster whose parent died must be stopped by
// hand (pg_ctl stop -D Dir/data).
//
// # Binaries
//
// FindBinaries looks for initdb and postgres on PATH, then in the highest
// version under /usr/lib/postgresql/*/bin (Debian and Ubuntu's layout). When
// they are missing the error wraps ErrNoBinaries and names the command that
// installs them.
package pgcluster
