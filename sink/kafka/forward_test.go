package kafka_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestForwardsEveryName checks that this deprecated package still offers
// every exported top-level name of kafkasink, so that code written against
// the old import path builds for the release it is kept.
func TestForwardsEveryName(t *testing.T) {
	want := exported(t, "../kafkasink")
	have := exported(t, ".")
	for _, name := range want {
		if !slices.Contains(have, name) {
			t.Errorf("sink/kafka does not forward kafkasink.%s", name)
		}
	}
}

// exported lists the exported top-level names (not methods) declared in
// the non-test files of dir.
func exported(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			names = append(names, declared(d)...)
		}
	}
	if len(names) == 0 {
		t.Fatalf("no exported names in %s", dir)
	}
	return names
}

// declared lists the exported names a top-level declaration declares.
func declared(d ast.Decl) []string {
	var names []string
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil && d.Name.IsExported() {
			names = append(names, d.Name.Name)
		}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				if s.Name.IsExported() {
					names = append(names, s.Name.Name)
				}
			case *ast.ValueSpec:
				for _, n := range s.Names {
					if n.IsExported() {
						names = append(names, n.Name)
					}
				}
			}
		}
	}
	return names
}
