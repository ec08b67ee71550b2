package logtest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestCheck: a repeated key (at the top or in a nested object), a float,
// and a _ms key that holds no integer are problems; zerolog's Dur, a
// logger context and an event that both add "topic" are caught; a line
// that is not a JSON log line is not checked.
func TestCheck(t *testing.T) {
	for _, tt := range []struct {
		line string
		want []string
	}{
		{`{"level":"info","topic":1,"retry_in_ms":250,"message":"ok"}`, nil},
		{`{"level":"info","topic":1,"group":"g","topic":1,"message":"x"}`, []string{`key "topic" repeated`}},
		{`{"level":"warn","retry_in":1234.5678,"message":"x"}`, []string{`"retry_in" is 1234.5678`}},
		{`{"level":"warn","waited_ms":"2s","message":"x"}`, []string{`"waited_ms" ends in _ms`}},
		{`{"level":"warn","span":{"a":1,"a":2},"message":"x"}`, []string{`key "span.a" repeated`}},
		{`{"level":"warn","xs":[1.5],"message":"x"}`, []string{`"xs[]" is 1.5`}},
		{`{"c_offset":1,"payload":{"amount":1.5,"amount":2}}`, nil}, // an event, not a log line
		{`GROUP  PARTITION`, nil},
		{`{"level":"info","message":`, nil}, // cut short: not JSON
	} {
		got := Check([]byte(tt.line))
		if len(got) != len(tt.want) {
			t.Errorf("Check(%s) = %q, want %d problems %q", tt.line, got, len(tt.want), tt.want)
			continue
		}
		for i := range got {
			if !strings.Contains(got[i], tt.want[i]) {
				t.Errorf("Check(%s)[%d] = %q, want it to say %q", tt.line, i, got[i], tt.want[i])
			}
		}
	}

	var b Buffer
	l := zerolog.New(&b).With().Int("topic", 1).Logger()
	l.Info().Int("topic", 1).Dur("retry_in", 1500*time.Microsecond).Msg("twice")
	l.Info().Int64("retry_in_ms", 2).Msg("once")
	if p := b.Problems(); len(p) != 2 || !strings.Contains(p[0], `"topic" repeated`) || !strings.Contains(p[1], `"retry_in" is 1.5`) {
		t.Errorf("problems of zerolog's lines: %q", p)
	}
}

// TestNoDurInLogs: no log line of pgevents' code is written with
// zerolog's Dur (or TimeDiff), which writes a float without a unit: a
// duration is logged as Int64("<name>_ms", d.Milliseconds()), one rule
// everywhere. Check finds a Dur only when its value is not a whole number
// of milliseconds; this finds it in the source.
func TestNoDurInLogs(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Dur" && sel.Sel.Name != "Durs" && sel.Sel.Name != "TimeDiff") || len(call.Args) < 2 {
				return true
			}
			if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				t.Errorf("%s: logs a duration with %s(%s): log Int64(%q, d.Milliseconds()) instead",
					fset.Position(call.Pos()), sel.Sel.Name, lit.Value, strings.Trim(lit.Value, `"`)+"_ms")
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func ExampleCheck() {
	fmt.Println(Check([]byte(`{"level":"warn","topic":1,"topic":1,"retry_in":12.5,"message":"batch failed"}`)))
	// Output: [key "topic" repeated "retry_in" is 12.5, not an integer (a duration is integer milliseconds under a key ending in _ms)]
}
