package pgcluster

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
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
