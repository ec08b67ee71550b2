package docs_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// runnableRE matches the marker of a runnable block, the line before its
// fence: <!-- runnable -->, <!-- runnable: background --> or
// <!-- runnable: expect TEXT -->. (<!-- runnable: sandbox --> blocks, the
// deployment guide's, run in the consumercli tests, in a sandbox.)
var runnableRE = regexp.MustCompile(`^<!-- runnable(?:: (background|expect (.+?)))? -->$`)

// runnable is a block of shell commands a document marks as runnable.
type runnable struct {
	where  string // file:line of its first command
	code   string
	mode   string // "", "background" or "expect"
	expect string
}

// exampleURL is the database URL the documents' commands name; the test
// runs them on a database of their own instead.
const exampleURL = "postgres://postgres@127.0.0.1:5432/postgres"

// TestRunnableBlocks runs the shell blocks the documents mark runnable, as
// written, document by document, in order, in a scratch copy of the
// repository (its files linked, db-event-consumer.yml copied, no bin/),
// with the consumer binary on the PATH, DATABASE_URL (and the example URL
// the commands name) a fresh database of the throwaway cluster, and
// Kafka's port 9092 a free one:
//
//   - <!-- runnable -->: must exit 0;
//   - <!-- runnable: background -->: runs until the document's last block
//     has run (a server: consumer run, consumer kafka), then gets SIGINT
//     and must exit 0, as a terminal's Ctrl-C would stop it;
//   - <!-- runnable: expect TEXT -->: run again until it exits 0 with
//     TEXT in its output (what a reader in another shell sees once the
//     consumer got there), within a minute.
//
// A document whose blocks need a tool the machine lacks (psql, kcat) is
// skipped, saying so.
func TestRunnableBlocks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary: not in -short")
	}
	docs := map[string][]runnable{}
	var names []string
	for _, name := range markdownFiles(t) {
		lines := readMarkdown(t, name)
		for i, l := range lines {
			if !l.fenced || i == 0 {
				continue
			}
			m := runnableRE.FindStringSubmatch(strings.TrimSpace(lines[i-1].text))
			if m == nil {
				continue
			}
			if l.lang != "sh" {
				t.Errorf("%s:%d: a runnable block is fenced ```%s, not ```sh", name, l.n, l.lang)
				continue
			}
			r := runnable{where: fmt.Sprintf("%s:%d", name, l.n+1), code: strings.Join(l.code, "\n") + "\n", mode: m[1], expect: m[2]}
			if strings.HasPrefix(r.mode, "expect") {
				r.mode = "expect"
			}
			if docs[name] == nil {
				names = append(names, name)
			}
			docs[name] = append(docs[name], r)
		}
	}
	if len(docs) == 0 {
		t.Fatal("no document marks a block runnable")
	}
	bin, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runDocument(t, name, docs[name], filepath.Dir(bin))
		})
	}
}

// runDocument runs the runnable blocks of document name, with the
// directory binDir (where `consumer` is) on the PATH.
func runDocument(t *testing.T, name string, blocks []runnable, binDir string) {
	for _, tool := range []string{"psql", "kcat"} {
		uses := false
		for _, b := range blocks {
			uses = uses || regexp.MustCompile(`(^|\s)`+tool+`\s`).MatchString(b.code)
		}
		if _, err := exec.LookPath(tool); uses && err != nil {
			t.Skipf("%s's commands run %s, which is not installed", name, tool)
		}
	}
	url := pgtest.NewDB(t)
	port := freePort(t)
	scratch := scratchClone(t)
	env := append(os.Environ(), "DATABASE_URL="+url, "PATH="+binDir+":"+os.Getenv("PATH"))
	edit := func(code string) string {
		code = strings.ReplaceAll(code, exampleURL, url)
		return regexp.MustCompile(`\b9092\b`).ReplaceAllString(code, strconv.Itoa(port))
	}
	var background []*exec.Cmd
	var outs []*logtest.Buffer // their output, whose log lines are checked
	defer func() {
		for i, cmd := range background {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("the background block of %s stopped with SIGINT: %v\n%s", name, err, outs[i])
				}
			case <-time.After(30 * time.Second):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				t.Errorf("the background block of %s did not stop within 30 s of SIGINT\n%s", name, outs[i])
			}
		}
	}()
	for _, b := range blocks {
		command := func(ctx context.Context) *exec.Cmd {
			cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", edit(b.code))
			cmd.Dir, cmd.Env = scratch, env
			return cmd
		}
		switch b.mode {
		case "background":
			cmd := command(context.Background())
			out := logtest.New(t)
			cmd.Stdout, cmd.Stderr = out, out
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatalf("%s: %v", b.where, err)
			}
			background, outs = append(background, cmd), append(outs, out)
		case "expect":
			deadline := time.Now().Add(time.Minute)
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				out, err := command(ctx).CombinedOutput()
				cancel()
				if err == nil && bytes.Contains(out, []byte(b.expect)) {
					break
				}
				if time.Now().After(deadline) {
					var bg strings.Builder
					for _, o := range outs {
						bg.WriteString(o.String())
					}
					t.Fatalf("%s: within a minute, never exited 0 saying %q; last: %v\n%s\nthe background blocks said:\n%s",
						b.where, b.expect, err, out, bg.String())
				}
				time.Sleep(200 * time.Millisecond)
			}
		default:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			out, err := command(ctx).CombinedOutput()
			cancel()
			if err != nil {
				t.Fatalf("%s: %v\n%s", b.where, err, out)
			}
		}
	}
}

// scratchClone returns a directory that looks like a clone of the
// repository to the documents' commands: each of its top-level entries
// linked, but bin/ (the commands build it) and db-event-consumer.yml,
// copied (the commands may edit it).
func scratchClone(t *testing.T) string {
	dir := t.TempDir()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(root)
	for _, e := range entries {
		switch n := e.Name(); {
		case n == "bin" || n == ".git" || strings.HasPrefix(n, ".pgevents-"):
		case n == "db-event-consumer.yml":
			data, err := os.ReadFile(filepath.Join(abs, n))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, n), data, 0o644); err != nil {
				t.Fatal(err)
			}
		default:
			if err := os.Symlink(filepath.Join(abs, n), filepath.Join(dir, n)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// freePort returns a TCP port nothing listens on at the moment.
func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
