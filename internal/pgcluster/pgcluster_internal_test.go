package pgcluster

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestFindBinariesMissing(t *testing.T) {
	empty := t.TempDir()
	t.Setenv("PATH", empty)
	old := versionedBinDirs
	versionedBinDirs = filepath.Join(empty, "*", "bin")
	t.Cleanup(func() { versionedBinDirs = old })

	_, err := FindBinaries()
	if !errors.Is(err, ErrNoBinaries) {
		t.Fatalf("err = %v, want ErrNoBinaries", err)
	}
	const want = "PostgreSQL server binaries not found (initdb, postgres); install them with: sudo apt-get install -y postgresql"
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %q, want it to contain %q", err, want)
	}
}

func TestFindBinariesHighestVersion(t *testing.T) {
	root := t.TempDir()
	t.Setenv("PATH", root)
	for _, v := range []string{"9.6", "15", "12"} {
		bin := filepath.Join(root, v, "bin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"initdb", "postgres"} {
			if err := os.WriteFile(filepath.Join(bin, name), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	old := versionedBinDirs
	versionedBinDirs = filepath.Join(root, "*", "bin")
	t.Cleanup(func() { versionedBinDirs = old })

	dir, err := FindBinaries()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "15", "bin"); dir != want {
		t.Fatalf("FindBinaries = %s, want %s", dir, want)
	}
}

func TestSettingsOrderAndOverride(t *testing.T) {
	got := settings("/tmp/x", 5433, map[string]string{"fsync": "off", "shared_buffers": "16MB", "port": "1"})
	joined := strings.Join(got, " ")
	for _, want := range []string{"fsync=off", "shared_buffers=16MB", "port=5433", "listen_addresses=127.0.0.1", "unix_socket_directories=/tmp/x", "max_prepared_transactions=0"} {
		if !strings.Contains(joined, want) {
			t.Errorf("settings %q lack %q", joined, want)
		}
	}
	long := "/" + strings.Repeat("d", maxSocketDirLen)
	if joined := strings.Join(settings(long, 1, nil), " "); !strings.HasSuffix(joined, "unix_socket_directories=") {
		t.Errorf("long dir should disable the socket: %q", joined)
	}
}

// rootUser returns the server user, skipping the test unless it runs as
// root: only then does the server run as another user, who may be unable
// to reach a directory.
func rootUser(t *testing.T) *osUser {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root: only then does the server run as the postgres user, who may not reach a directory")
	}
	o, err := serverUser()
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// mkdirTemp returns a new directory under os.TempDir() with mode perm,
// removed at the end of the test.
func mkdirTemp(t *testing.T, perm os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgcluster-relocate-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, perm); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRelocate checks where relocate puts a cluster requested in a
// directory the server user cannot reach, and that a rerun finds it again,
// whether through the link, by name, or afresh once it was removed.
func TestRelocate(t *testing.T) {
	o := rootUser(t)
	base := mkdirTemp(t, 0o755)
	unreachable := mkdirTemp(t, 0o700)
	old := relocationBases
	relocationBases = func() []string { return []string{filepath.Join(base, "missing"), unreachable, base} }
	t.Cleanup(func() { relocationBases = old })

	private := mkdirTemp(t, 0o700) // root's, like a 0700 home
	requested := filepath.Join(private, "repo", ".pgevents-demo", "pg")
	want := filepath.Join(base, relocationName(requested))

	check := func(step string) {
		t.Helper()
		got, claimed, err := o.relocate(requested)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if got != want || !claimed {
			t.Fatalf("%s: relocate = %s, %v; want %s, true", step, got, claimed, want)
		}
		if link, err := os.Readlink(requested); err != nil || link != want {
			t.Fatalf("%s: %s links to %q (%v), want %s", step, requested, link, err, want)
		}
		st, err := os.Lstat(want)
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if !st.IsDir() || st.Mode().Perm() != 0o700 || sys.Uid != o.uid {
			t.Fatalf("%s: %s: mode %v, uid %d; want a directory, 0700, uid %d", step, want, st.Mode(), sys.Uid, o.uid)
		}
		if b, err := o.blockedAncestor(filepath.Join(want, "data")); err != nil || b != "" {
			t.Fatalf("%s: %s not reachable by %s: blocked at %q (%v)", step, want, o.name, b, err)
		}
	}
	check("first")
	if err := os.WriteFile(filepath.Join(want, "kept"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	check("through the link")
	if err := os.Remove(requested); err != nil {
		t.Fatal(err)
	}
	check("by name")
	if _, err := os.Stat(filepath.Join(want, "kept")); err != nil {
		t.Fatalf("the relocated directory was not reused: %v", err)
	}
	if err := os.RemoveAll(want); err != nil {
		t.Fatal(err)
	}
	check("after the directory was removed")

	// A reachable directory stays where it is.
	if got, claimed, err := o.relocate(filepath.Join(base, "here")); err != nil || got != filepath.Join(base, "here") || claimed {
		t.Fatalf("reachable dir: relocate = %s, %v, %v", got, claimed, err)
	}
	// Each requested directory has its own.
	if other := relocationName(filepath.Join(private, "repo2", ".pgevents-demo", "pg")); other == filepath.Base(want) {
		t.Fatalf("two paths share the relocation name %s", other)
	}
}

// TestRelocateRefuses checks what relocate will not do: replace a
// directory that holds files, or take over a directory of the predictable
// name that someone else made, or a link planted in its place.
func TestRelocateRefuses(t *testing.T) {
	o := rootUser(t)
	base := mkdirTemp(t, 0o755)
	old := relocationBases
	relocationBases = func() []string { return []string{base} }
	t.Cleanup(func() { relocationBases = old })
	private := mkdirTemp(t, 0o700)

	full := filepath.Join(private, "full")
	if err := os.MkdirAll(filepath.Join(full, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, _, err := o.relocate(full); err == nil || !strings.Contains(err.Error(), "not empty; move its contents away or run: chmod o+x "+private) {
		t.Fatalf("non-empty directory: err = %v", err)
	}

	// A directory of the predictable name made by another user.
	squatted := filepath.Join(private, "squatted")
	p := filepath.Join(base, relocationName(squatted))
	if err := os.Mkdir(p, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, _, err := o.relocate(squatted); err == nil || !strings.Contains(err.Error(), "belongs to neither root nor postgres") {
		t.Fatalf("directory owned by another user: err = %v", err)
	}

	// A link planted under the predictable name must not be followed.
	victim := mkdirTemp(t, 0o755)
	planted := filepath.Join(private, "planted")
	if err := os.Symlink(victim, filepath.Join(base, relocationName(planted))); err != nil {
		t.Fatal(err)
	}
	if _, _, err := o.relocate(planted); err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Fatalf("planted link: err = %v", err)
	}
	st, err := os.Stat(victim)
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != 0 || st.Mode().Perm() != 0o755 {
		t.Fatalf("the planted link's target was changed: uid %d, mode %v", sys.Uid, st.Mode())
	}
}
