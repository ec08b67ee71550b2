package docs_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// reference is the document whose section "## Commands" documents the
// consumer command.
const reference = "docs/reference.md"

// binary is consumer-dev, the consumer command with every command (demo
// and bench in-process), built once for the test; its development
// packages live under cmd/consumer-dev/internal, out of this package's
// reach, so it is run, not linked.
var binary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "pgevents-docs-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "consumer")
	out, err := exec.Command("go", "build", "-o", bin, "../cmd/consumer-dev").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ../cmd/consumer-dev: %v\n%s", err, out)
	}
	return bin, nil
})

// run runs the command line args and returns what it printed (its exit
// status is checked by the consumercli tests of -h).
func run(args ...string) string {
	bin, err := binary()
	if err != nil {
		panic(err)
	}
	out, _ := exec.Command(bin, args...).CombinedOutput()
	return string(out)
}

var (
	// flagRE matches a flag in a flag set's PrintDefaults: "  -name type".
	flagRE = regexp.MustCompile(`(?m)^  -([\w-]+)`)
	// flagDefaultRE matches the default PrintDefaults gives a flag at the
	// end of its usage: (default "x") or (default 2s).
	flagDefaultRE = regexp.MustCompile(`\(default ("[^"]*"|[^\s:)]+)\)$`)
	// helpRE matches what a command prints when its flag set was given -h:
	// the heading of its flags.
	helpRE = regexp.MustCompile(`(?m)^Flags:( none)?$`)
)

// codeFlags returns the flags of the command line words (its positional
// arguments filled in with placeholders) and their defaults, from what
// `consumer words... -h` prints, and whether it printed a flag set's help.
func codeFlags(words []string, positional int) (map[string]string, bool) {
	args := slices.Clone(words)
	for range positional {
		args = append(args, "x")
	}
	out := run(append(args, "-h")...)
	if !helpRE.MatchString(out) {
		return nil, false
	}
	flags := map[string]string{}
	lines := strings.Split(out, "\n")
	for i, line := range lines {
		m := flagRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		flags[m[1]] = ""
		if i+1 < len(lines) {
			if d := flagDefaultRE.FindStringSubmatch(strings.TrimSpace(lines[i+1])); d != nil {
				flags[m[1]] = strings.Trim(d[1], `"`)
			}
		}
	}
	return flags, true
}

// codeCommands returns the commands of the binary: the words of each line
// of its usage's list, a command with subcommands replaced by them (what
// `consumer <command> -h` names when it is no flag set's help).
func codeCommands(t *testing.T) []string {
	usage := run("-h")
	_, list, ok := strings.Cut(usage, "commands:\n")
	if !ok {
		t.Fatalf("consumer -h prints no list of commands:\n%s", usage)
	}
	var cmds []string
	for _, line := range strings.Split(list, "\n") {
		if !strings.HasPrefix(line, "  ") || strings.HasPrefix(line, "   ") {
			continue
		}
		name := strings.Fields(line)[0]
		if slices.ContainsFunc(cmds, func(c string) bool { return strings.Fields(c)[0] == name }) {
			continue
		}
		if _, leaf := codeFlags([]string{name}, 0); leaf {
			cmds = append(cmds, name)
			continue
		}
		subRE := regexp.MustCompile(`consumer ` + name + ` ([a-z]+(?:\|[a-z]+)*)`)
		var subs []string
		for _, m := range subRE.FindAllStringSubmatch(run(name, "-h"), -1) {
			for _, s := range strings.Split(m[1], "|") {
				if !slices.Contains(subs, name+" "+s) {
					subs = append(subs, name+" "+s)
				}
			}
		}
		if len(subs) == 0 {
			t.Errorf("consumer %s -h prints neither its flags nor its subcommands", name)
		}
		cmds = append(cmds, subs...)
	}
	return cmds
}

// docCommand is a command documented in the reference: a heading
// "### `consumer words... POSITIONAL...`" and its table of flags.
type docCommand struct {
	line       int
	positional int
	flags      map[string]docFlag
}

type docFlag struct {
	line int
	def  string
}

var (
	commandHeadingRE = regexp.MustCompile("^### `consumer ([^`]+)`$")
	flagRowRE        = regexp.MustCompile("^\\| `--([\\w-]+)[^`]*` \\| ([^|]*) \\|")
)

// docCommands returns the commands the reference's section "## Commands"
// documents, by their words.
func docCommands(t *testing.T) map[string]*docCommand {
	cmds := map[string]*docCommand{}
	inSection := false
	var cur *docCommand
	for _, l := range readMarkdown(t, reference) {
		switch {
		case l.fenced:
		case strings.HasPrefix(l.text, "## "):
			inSection = l.text == "## Commands"
			cur = nil
		case !inSection:
		case strings.HasPrefix(l.text, "### "):
			cur = nil
			m := commandHeadingRE.FindStringSubmatch(l.text)
			if m == nil {
				continue
			}
			var words []string
			cur = &docCommand{line: l.n, flags: map[string]docFlag{}}
			for _, w := range strings.Fields(m[1]) {
				if w == strings.ToLower(w) {
					words = append(words, w)
				} else {
					cur.positional++
				}
			}
			key := strings.Join(words, " ")
			if prev, dup := cmds[key]; dup {
				t.Errorf("%s:%d: consumer %s is documented twice (first on line %d)", reference, l.n, key, prev.line)
			}
			cmds[key] = cur
		case cur != nil:
			if m := flagRowRE.FindStringSubmatch(l.text); m != nil {
				cur.flags[m[1]] = docFlag{line: l.n, def: strings.ReplaceAll(strings.TrimSpace(m[2]), "`", "")}
			}
		}
	}
	if len(cmds) == 0 {
		t.Fatalf("%s documents no command under ## Commands (headings ### `consumer ...`)", reference)
	}
	return cmds
}

// TestCommandsReference: every command of the consumer binary (consumer-dev's
// demo and bench included) and every flag of its flag set is documented in
// docs/reference.md#commands, with the default the flag set gives it; and
// every command and flag documented there exists.
func TestCommandsReference(t *testing.T) {
	doc := docCommands(t)
	code := codeCommands(t)
	for _, name := range code {
		if _, ok := doc[name]; !ok {
			t.Errorf("command consumer %s is missing from %s#commands (a heading ### `consumer %s`)", name, reference, name)
		}
	}
	for name, d := range doc {
		where := fmt.Sprintf("%s:%d: consumer %s", reference, d.line, name)
		if !slices.Contains(code, name) {
			t.Errorf("%s is documented, but the binary has no such command", where)
			continue
		}
		flags, ok := codeFlags(strings.Fields(name), d.positional)
		if !ok {
			t.Errorf("%s -h prints no flag set's help", where)
			continue
		}
		for f, def := range flags {
			df, ok := d.flags[f]
			switch {
			case !ok:
				t.Errorf("%s: flag --%s is missing from its table", where, f)
			case def != "" && df.def != def:
				t.Errorf("%s:%d: consumer %s --%s: default %q, the code's is %q", reference, df.line, name, f, df.def, def)
			}
		}
		for f, df := range d.flags {
			if _, ok := flags[f]; !ok {
				t.Errorf("%s:%d: consumer %s --%s is documented, but the command has no such flag", reference, df.line, name, f)
			}
		}
	}
}
