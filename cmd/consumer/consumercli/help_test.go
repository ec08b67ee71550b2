package consumercli

import (
	"bytes"
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// commandPaths returns the words of every command of the binary whose
// usage is usageText: each built-in command and subcommand, walked from
// the table Main dispatches through (so that a command added there is
// covered), and the commands the usage lists beyond them (the production
// binary's demo and bench, handed to consumer-dev).
func commandPaths(t *testing.T, usageText string) [][]string {
	t.Helper()
	var paths [][]string
	var walk func(prefix []string, cmds []*command)
	walk = func(prefix []string, cmds []*command) {
		for _, c := range cmds {
			p := append(slices.Clone(prefix), c.name)
			paths = append(paths, p)
			walk(p, c.subs)
		}
	}
	walk(nil, builtins)
	_, list, ok := strings.Cut(usageText, "commands:\n")
	if !ok {
		t.Fatalf("the usage lists no commands:\n%s", usageText)
	}
	for _, line := range strings.Split(list, "\n") {
		if !strings.HasPrefix(line, "  ") || strings.HasPrefix(line, "   ") {
			continue
		}
		name := strings.Fields(line)[0]
		if !slices.ContainsFunc(paths, func(p []string) bool { return p[0] == name }) {
			paths = append(paths, []string{name})
		}
	}
	for _, c := range builtins {
		if !strings.Contains(list, "\n  "+c.name+" ") && !strings.HasPrefix(list, "  "+c.name+" ") {
			t.Errorf("the usage's list of commands does not name %q", c.name)
		}
	}
	return paths
}

// TestHelp: every command and subcommand of the production binary, given
// -h or --help (first, or after other flags), prints its usage to stdout
// and nothing to stderr, and exits 0, before any configuration file is
// read (there is none where it runs). Requested help goes to stdout, as
// GNU's --help and `consumer -h` do, so that it pipes into a pager; usage
// errors go to stderr with exit status 2, which a command with
// subcommands given none, or an unknown one, gives.
func TestHelp(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	dir := t.TempDir() // no db-event-consumer.yml here
	exe := func(args ...string) (int, string, string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		cmd.Env = append(cmd.Environ(), "DATABASE_URL=postgres://nobody@127.0.0.1:1/none")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, stdout.String(), stderr.String()
	}
	_, top, _ := exe("-h")
	paths := append([][]string{nil}, commandPaths(t, top)...)
	for _, path := range paths {
		for _, h := range []string{"-h", "--help"} {
			args := append(slices.Clone(path), h)
			code, stdout, stderr := exe(args...)
			name := "consumer"
			if len(path) > 0 && !slices.ContainsFunc(builtins, func(c *command) bool { return c.name == path[0] }) {
				name = DevBinary // a delegated command: consumer-dev's usage
			}
			want := strings.TrimSpace(name + " " + strings.Join(path, " "))
			if code != exitOK || !strings.HasPrefix(stdout, "usage:") || !strings.Contains(stdout, want) || strings.TrimSpace(stderr) != "" {
				t.Errorf("consumer %s: exit %d, want 0 with its usage (naming %q) on stdout and nothing on stderr\nstdout:\n%s\nstderr:\n%s",
					strings.Join(args, " "), code, want, stdout, stderr)
			}
		}
	}
	// After flags, and after a group's positional argument.
	for _, args := range [][]string{{"status", "--json", "-h"}, {"group", "pause", "billing", "--help"}, {"dlq", "discard", "7", "-h"}} {
		if code, stdout, stderr := exe(args...); code != exitOK || !strings.Contains(stdout, "usage: consumer "+args[0]) || stderr != "" {
			t.Errorf("consumer %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout, stderr)
		}
	}
	// Usage errors: stderr, status 2.
	for _, c := range builtins {
		if len(c.subs) == 0 {
			continue
		}
		for _, args := range [][]string{{c.name}, {c.name, "nosuch"}} {
			code, stdout, stderr := exe(args...)
			if code != exitUsage || stdout != "" || !strings.Contains(stderr, "usage:") {
				t.Errorf("consumer %s: exit %d, want %d with the usage on stderr only\nstdout:\n%s\nstderr:\n%s",
					strings.Join(args, " "), code, exitUsage, stdout, stderr)
			}
		}
	}
	if code, stdout, stderr := exe("run", "--nosuch"); code != exitUsage || stdout != "" || !strings.Contains(stderr, "-nosuch") {
		t.Errorf("consumer run --nosuch: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// TestHelpInProcess: Main, as a service's own binary calls it, answers
// -h for each built-in command and subcommand with its usage on stdout,
// under the binary's name, and status 0.
func TestHelpInProcess(t *testing.T) {
	t.Parallel()
	cli := &CLI{Name: "billing-consumer"}
	var walk func(prefix []string, cmds []*command)
	walk = func(prefix []string, cmds []*command) {
		for _, c := range cmds {
			path := append(slices.Clone(prefix), c.name)
			var stdout, stderr bytes.Buffer
			code := cli.Main(context.Background(), append(slices.Clone(path), "-h"), &stdout, &stderr)
			if code != exitOK || !strings.Contains(stdout.String(), "billing-consumer "+strings.Join(path, " ")) || stderr.Len() > 0 {
				t.Errorf("%s -h: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(path, " "), code, stdout.String(), stderr.String())
			}
			walk(path, c.subs)
		}
	}
	walk(nil, builtins)
}
