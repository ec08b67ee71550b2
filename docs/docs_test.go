package docs_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// root is the repository's root, relative to this directory.
const root = ".."

// markdownFiles returns the documents checked: README.md and docs/*.md,
// relative to root.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range more {
		rel, _ := filepath.Rel(root, f)
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

// mdLine is a line of a Markdown file outside its code blocks, or the
// opening line of a code block with its content.
type mdLine struct {
	n    int    // line number, from 1
	text string // the line (outside code blocks)
	// lang and code are a fenced code block's info string and content,
	// when the line opens one.
	lang   string
	code   []string
	fenced bool
}

// readMarkdown splits the file at root/name into lines and code blocks.
func readMarkdown(t *testing.T, name string) []mdLine {
	t.Helper()
	f, err := os.Open(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []mdLine
	var block *mdLine
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case block != nil && strings.HasPrefix(trimmed, "```"):
			out = append(out, *block)
			block = nil
		case block != nil:
			block.code = append(block.code, line)
		case strings.HasPrefix(trimmed, "```"):
			block = &mdLine{n: n, lang: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), fenced: true}
		default:
			out = append(out, mdLine{n: n, text: line})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if block != nil {
		t.Errorf("%s:%d: code block never closed", name, block.n)
	}
	return out
}

var (
	headingRE    = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	inlineCodeRE = regexp.MustCompile("`[^`]*`")
	// linkRE matches an inline link or image: [text](target) or
	// ![alt](target "title").
	linkRE    = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	mdLinkRE  = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	htmlTagRE = regexp.MustCompile(`<[^>]+>`)
)

// slug is a heading's anchor by GitHub's rules: the heading's text
// (without Markdown), lowercased, each space a '-', every character but
// letters, digits, '-' and '_' dropped.
func slug(heading string) string {
	s := mdLinkRE.ReplaceAllString(heading, "$1")
	s = htmlTagRE.ReplaceAllString(s, "")
	s = strings.ToLower(s)
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of the headings of a Markdown file: a
// heading's slug, suffixed -1, -2... when an earlier heading has it.
func anchors(t *testing.T, name string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, l := range readMarkdown(t, name) {
		m := headingRE.FindStringSubmatch(l.text)
		if l.fenced || m == nil {
			continue
		}
		a := slug(m[1])
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestDocsLinks: every relative link of README.md and docs/*.md names a
// file that exists, and its anchor a heading of the file it names.
func TestDocsLinks(t *testing.T) {
	cache := map[string]map[string]bool{}
	for _, name := range markdownFiles(t) {
		for _, l := range readMarkdown(t, name) {
			if l.fenced {
				continue
			}
			text := inlineCodeRE.ReplaceAllString(l.text, "")
			for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				file := name
				if path != "" {
					file = filepath.ToSlash(filepath.Join(filepath.Dir(name), path))
					if _, err := os.Stat(filepath.Join(root, file)); err != nil {
						t.Errorf("%s:%d: link %s: %s does not exist", name, l.n, target, file)
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(file, ".md") {
					continue
				}
				if cache[file] == nil {
					cache[file] = anchors(t, file)
				}
				if !cache[file][anchor] {
					t.Errorf("%s:%d: link %s: %s has no heading whose anchor is #%s", name, l.n, target, file, anchor)
				}
			}
		}
	}
}

// fragmentImports are the packages a fragment may name without importing
// them, by the name it uses.
var fragmentImports = map[string]string{
	"pgevents":     "github.com/pgevents/pgevents",
	"pgeventstest": "github.com/pgevents/pgevents/pgeventstest",
	"consumercli":  "github.com/pgevents/pgevents/cmd/consumer/consumercli",
	"config":       "github.com/pgevents/pgevents/config",
	"offsets":      "github.com/pgevents/pgevents/offsets",
	"schema":       "github.com/pgevents/pgevents/schema",
	"pgx":          "github.com/jackc/pgx/v5",
	"pgxpool":      "github.com/jackc/pgx/v5/pgxpool",
	"context":      "context",
	"errors":       "errors",
	"fmt":          "fmt",
	"json":         "encoding/json",
	"http":         "net/http",
	"log":          "log",
	"os":           "os",
	"slog":         "log/slog",
	"testing":      "testing",
	"time":         "time",
}

// fragmentTolerated are the errors of what a fragment leaves to its
// reader: names it does not define, variables and imports it does not use.
var fragmentTolerated = regexp.MustCompile(`: (undefined: [A-Za-z_]\w*$|declared and not used|"[^"]+" imported and not used)`)

// goBlock is a ```go block, the file it is compiled as, and whether it is
// a fragment.
type goBlock struct {
	where    string // file:line of the block's first line of code
	dir      string
	fragment bool
}

// TestDocsGoBlocks: every ```go block of README.md and docs/*.md compiles,
// as a complete file or as a fragment (see the package documentation).
// Each is built in a directory of its own inside the module, named so that
// ./... skips it, with line directives that make errors name the
// document's lines.
func TestDocsGoBlocks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds code: not in -short")
	}
	tmp, err := os.MkdirTemp(".", "_goblocks-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	var blocks []goBlock
	for _, name := range markdownFiles(t) {
		for _, l := range readMarkdown(t, name) {
			if !l.fenced || l.lang != "go" {
				continue
			}
			b := goBlock{where: fmt.Sprintf("%s:%d", name, l.n+1), dir: filepath.Join(tmp, fmt.Sprint(len(blocks)))}
			src := goFile(name, l.n+1, l.code, &b.fragment)
			if err := os.Mkdir(b.dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(b.dir, "block.go"), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			blocks = append(blocks, b)
		}
	}
	if len(blocks) == 0 {
		return
	}
	// One build of every block, reporting every error of each; then go vet
	// of the complete files.
	args := []string{"build", "-gcflags=-e", "-o", os.DevNull}
	var complete []string
	for _, b := range blocks {
		if !b.fragment {
			complete = append(complete, "./"+filepath.ToSlash(b.dir))
		}
	}
	for _, b := range blocks {
		out, _ := exec.Command("go", append(args, "./"+filepath.ToSlash(b.dir))...).CombinedOutput()
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if line == "" || strings.HasPrefix(line, "#") || (b.fragment && fragmentTolerated.MatchString(line)) {
				continue
			}
			t.Errorf("```go block at %s does not compile: %s", b.where, line)
		}
	}
	if len(complete) > 0 {
		if out, err := exec.Command("go", append([]string{"vet"}, complete...)...).CombinedOutput(); err != nil {
			t.Errorf("go vet of the complete ```go blocks:\n%s", out)
		}
	}
}

// goFile returns the source a ```go block of file, whose code starts on
// line first, is compiled as, and sets *fragment when it is one.
func goFile(file string, first int, code []string, fragment *bool) string {
	directive := fmt.Sprintf("//line %s:%d\n", file, first)
	body := strings.Join(code, "\n") + "\n"
	for _, line := range code {
		s := strings.TrimSpace(line)
		if s == "" || strings.HasPrefix(s, "//") {
			continue
		}
		if strings.HasPrefix(s, "package ") {
			return directive + body
		}
		break
	}
	*fragment = true
	var b strings.Builder
	b.WriteString("package fragment\n\n")
	var names []string
	for name := range fragmentImports {
		if regexp.MustCompile(`\b` + name + `\.`).MatchString(body) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Fprintf(&b, "import %s %q\n", name, fragmentImports[name])
	}
	topLevel := false
	for _, line := range code {
		if s := strings.TrimSpace(line); s != "" && !strings.HasPrefix(s, "//") {
			topLevel = regexp.MustCompile(`^(func|type|var|const|import)\b`).MatchString(line)
			break
		}
	}
	if topLevel {
		b.WriteString(directive + body)
	} else {
		b.WriteString("\nfunc _() {\n" + directive + body + "}\n")
	}
	return b.String()
}
