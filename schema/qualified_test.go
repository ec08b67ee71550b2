package schema_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/pgevents/pgevents/schema"
)

// pgevents' tables and views, as the migrations name them.
var tables = []string{"log_counter", "outbox_message_t", "consumer_offsets", "dead_letter_queue", "parked_hosts",
	"parked_events", "partition_halts", "consumer_replicas", "partition_leases", "partition_ownership", "topic_layouts",
	"group_layouts", "subscriptions", "topic_retention", "retention_skips", "partition_counters", "pgevents_schema_migrations", "console_audit",
	"topic_samples", "group_samples"}

// TestStatementsNameTheSchema reads the statements in the Go source of
// pgevents' packages and fails on any that names one of pgevents' tables
// or functions without schema.Marker before it: run with a schema of its
// own, such a statement would find the application's table of that name,
// or none. (The benchmark's statements run on a database of their own with
// pgevents in the search_path, and the test helpers are not pgevents'
// statements: testHelpers.)
// testHelpers are the directories whose statements are not pgevents' own:
// the test harness under internal/, and consumer-dev's demo and benchmark
// under cmd/consumer-dev/internal.
var testHelpers = map[string]bool{
	"internal/pgtest": true, "internal/pgcluster": true, "internal/eventtest": true, "internal/sinktest": true,
	"cmd/consumer-dev/internal": true,
}

func TestStatementsNameTheSchema(t *testing.T) {
	tableRef := regexp.MustCompile(`(?i)\b(?:FROM|JOIN|INTO|UPDATE|TABLE|EXISTS|ONLY)\s+(` + strings.Join(tables, "|") + `)\b`)
	funcRef := regexp.MustCompile(`\b(` + strings.Join(schema.Functions(), "|") + `)\s*\(`)
	root := filepath.Join("..")
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if path != root && strings.HasPrefix(d.Name(), ".") || testHelpers[filepath.ToSlash(rel)] {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			for _, m := range tableRef.FindAllStringSubmatchIndex(s, -1) {
				t.Errorf("%s: %q names table %s without schema.Marker", rel, excerpt(s, m[0], m[1]), s[m[2]:m[3]])
			}
			for _, m := range funcRef.FindAllStringSubmatchIndex(s, -1) {
				// A literal that starts with the name follows a prefix built
				// in Go (the adopt package's).
				if m[2] > 0 && !strings.HasSuffix(s[:m[2]], schema.Marker) && !strings.HasSuffix(s[:m[2]], ".") {
					t.Errorf("%s: %q calls %s without schema.Marker", rel, excerpt(s, m[0], m[1]), s[m[2]:m[3]])
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 20 {
		t.Fatalf("checked %d files: the walk did not find the source", checked)
	}
}

func excerpt(s string, i, j int) string {
	return strings.Join(strings.Fields(s[max(0, i-30):min(len(s), j+30)]), " ")
}
