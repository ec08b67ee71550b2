package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDataPathIsTrue: every file, Go function and SQL object that the data
// path table of docs/concepts.md ("The data path") names exists where the
// table says: a file moved, a function renamed or an SQL object dropped
// fails here until the table says where the step went.
func TestDataPathIsTrue(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, "docs", "concepts.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "### The data path\n")
	if !ok {
		t.Fatal(`docs/concepts.md has no "### The data path" section`)
	}
	var rows []string
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "## ") {
			break
		}
		if strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| step ") {
			rows = append(rows, line)
		}
	}
	if len(rows) < 6 {
		t.Fatalf("the data path table has %d steps, want producer, log, wake-up, claim, handler, commit", len(rows))
	}
	current := schemaCurrent(t)
	tick := regexp.MustCompile("`([^`]+)`")
	for _, row := range rows {
		cells := strings.Split(strings.Trim(row, "|"), "|")
		if len(cells) != 4 {
			t.Errorf("data path row %q: %d cells, want 4", row, len(cells))
			continue
		}
		step := strings.TrimSpace(cells[0])
		// The Go cell: files, each followed by the functions it holds.
		var file, src string
		for _, m := range tick.FindAllStringSubmatch(cells[2], -1) {
			name := m[1]
			if strings.HasSuffix(name, ".go") {
				b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
				if err != nil {
					t.Errorf("step %s names %s: %v", step, name, err)
					file, src = "", ""
					continue
				}
				file, src = name, string(b)
				continue
			}
			if file == "" {
				continue
			}
			ident := name[strings.LastIndex(name, ".")+1:]
			decl := regexp.MustCompile(`(?m)(^func (\([^)]*\) )?` + regexp.QuoteMeta(ident) + `[\[(]|^\s*` + regexp.QuoteMeta(ident) + `\s*=|^type ` + regexp.QuoteMeta(ident) + `\b)`)
			if !decl.MatchString(src) {
				t.Errorf("step %s says %s holds %s: it declares no %s", step, file, name, ident)
			}
		}
		// The SQL cell: objects of schema/current.
		for _, m := range tick.FindAllStringSubmatch(cells[3], -1) {
			object, _, _ := strings.Cut(m[1], ".")
			if !regexp.MustCompile(`\bpgevents\.` + regexp.QuoteMeta(object) + `\b`).MatchString(current) {
				t.Errorf("step %s names the SQL object %s, which schema/current does not define", step, m[1])
			}
		}
	}
}

// schemaCurrent returns schema/current/*.sql, concatenated.
func schemaCurrent(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "schema", "current", "*.sql"))
	if err != nil || len(files) == 0 {
		t.Fatalf("schema/current: %v (%d files)", err, len(files))
	}
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(data)
	}
	return b.String()
}
