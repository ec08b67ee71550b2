package layers

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is the import path every name in the table is relative to; "."
// is the root package pgevents.
const module = "github.com/pgevents/pgevents"

// Groups of packages the rules name more than once.
var (
	// base: the schema and the types every layer shares; they import
	// nothing of the module.
	base = []string{"schema", "pgeventstype"}
	// engine: the SQL of claims, commits, positions and leases. Only the
	// root package, the public layers and metrics reach it; tools built on
	// pgevents go through the public layers, as a service's own would.
	engine = []string{"internal/store", "internal/lease"}
	// utilities: internal leaves, importing nothing of the module.
	utilities = []string{"internal/backoff", "internal/finetimer", "internal/netconn", "internal/human",
		"internal/tmpl", "internal/httpserve"}
	// testHelpers: internal packages for tests (and the dev command's
	// throwaway cluster); no production package imports them.
	testHelpers = []string{"internal/pgcluster", "internal/pgtest", "internal/logtest", "internal/eventtest",
		"internal/sinktest"}
	// publicLayers: the packages a service's own tools use beside the
	// root package. They do not import each other.
	publicLayers = []string{"offsets", "partition", "batching", "listener", "adopt"}
	// heavy: what the root package and the layers below it must not link
	// (the YAML decoder, a Kafka client): a service that only consumes
	// does not pay for the CLI's or the relays' dependencies. The
	// transitive check is TestProductionDependencies in consumercli.
	heavy = []string{"gopkg.in/yaml.v3", "github.com/twmb/franz-go"}
)

// rule says what the packages matching pkg may import from the module
// (anything else of the module is refused) and what they must not import
// (any package, of the module or not, checked by prefix).
type rule struct {
	pkg string   // a package, or a tree ending in "/..."
	may []string // packages of the module it may import
	not []string // what it must not import: names of the module, or paths of other modules
	why string   // the reason, for the maintainer and the failure message
}

// rules is the layering, lowest layer first. Every package of the module
// matches exactly one row; a new package fails the test until it has one.
var rules = []rule{
	// The bottom.
	{pkg: "schema", why: "the migrations and the database handle: every layer's base"},
	{pkg: "pgeventstype", why: "the Event type shared by the engine and the root package"},

	// Internal packages.
	{pkg: "internal/store", may: base, not: heavy,
		why: "the engine's SQL: only the schema below it"},
	{pkg: "internal/lease", may: cat(base, []string{"internal/store", "internal/backoff"}), not: heavy,
		why: "leases and fencing, on the engine's statements"},
	{pkg: "internal/backoff", why: "a leaf"},
	{pkg: "internal/finetimer", why: "a leaf"},
	{pkg: "internal/netconn", why: "a leaf"},
	{pkg: "internal/human", why: "a leaf"},
	{pkg: "internal/tmpl", why: "a leaf"},
	{pkg: "internal/httpserve", why: "a leaf"},
	{pkg: "internal/pgcluster", why: "a leaf: the throwaway PostgreSQL of the tests and consumer-dev"},
	{pkg: "internal/logtest", why: "a leaf"},
	{pkg: "internal/pgtest", may: []string{"schema", "internal/pgcluster", "internal/logtest"},
		why: "the database of the tests"},
	{pkg: "internal/eventtest", may: []string{"internal/pgtest"}, why: "test helpers"},
	{pkg: "internal/sinktest", may: []string{".", "internal/pgtest", "pgeventstest"},
		why: "the relays' test helpers, on the root package"},
	{pkg: "internal/layers", why: "this table"},

	// Public layers: the engine through its internal packages, never the
	// root package nor each other.
	{pkg: "offsets", may: cat(base, engine, utilities), not: cat(heavy, publicLayers),
		why: "positions, resets, halts: a public layer over the engine"},
	{pkg: "partition", may: cat(base, engine, utilities), not: cat(heavy, publicLayers),
		why: "the partition function and ownership: a public layer"},
	{pkg: "batching", may: cat(base, engine, utilities), not: cat(heavy, publicLayers),
		why: "batch sizing: a public layer"},
	{pkg: "listener", may: cat(base, engine, utilities), not: cat(heavy, publicLayers),
		why: "LISTEN with reconnection: a public layer"},
	{pkg: "adopt", may: base, not: cat(heavy, publicLayers),
		why: "adopting existing tables: a public layer on the schema alone"},

	// The root package.
	{pkg: ".", may: cat(base, engine, utilities, publicLayers), not: cat(heavy, testHelpers),
		why: "the consumer and the producer: the public layers and the engine, nothing above"},

	// Built on the root package.
	{pkg: "pgeventstest", may: cat([]string{"."}, base, []string{"internal/pgtest", "internal/logtest"}),
		why: "the test helpers a service's tests import"},
	{pkg: "metrics", may: cat([]string{"."}, base, []string{"internal/store", "internal/httpserve"}),
		why: "Prometheus metrics: reads the engine's state with the engine's own SQL fragments"},
	{pkg: "console", may: cat([]string{".", "offsets", "partition", "metrics"}, base, []string{"internal/human", "internal/httpserve"}),
		not: engine, why: "the web console: the engine only through public packages, as an operator's own tool would"},
	{pkg: "kafka", may: cat([]string{".", "offsets", "listener"}, base),
		not: engine, why: "the Kafka-protocol endpoint: the engine only through public packages"},
	{pkg: "sink", may: []string{"."}, why: "what the relays share"},
	{pkg: "sink/kafkasink", may: []string{".", "sink", "internal/tmpl"}, not: engine,
		why: "the relay to a Kafka cluster: a handler like a user's"},
	{pkg: "sink/webhook", may: []string{".", "sink", "internal/tmpl"}, not: engine,
		why: "the relay to an HTTP endpoint: a handler like a user's"},
	{pkg: "sink/kafka", may: []string{".", "sink/kafkasink"},
		why: "deprecated: forwards to sink/kafkasink"},
	{pkg: "config", may: cat([]string{".", "kafka", "sink", "sink/kafkasink", "sink/webhook"}, base),
		not: engine, why: "db-event-consumer.yml: maps the file onto the options of the packages it configures"},

	// The CLI and the commands.
	{pkg: "cmd/consumer/consumercli",
		may: cat([]string{".", "adopt", "config", "console", "kafka", "metrics", "offsets", "sink", "sink/kafkasink", "sink/webhook",
			"internal/human", "internal/backoff"}, base),
		not: cat(engine, testHelpers, []string{"cmd/consumer-dev/..."}),
		why: "the CLI: every layer below through public packages (and two leaf utilities: internal/human's wording, and internal/backoff for the start's wait for a database that cannot take the process yet, paced and logged as the consumer's own loops are); the dev tools stay out of production"},
	{pkg: "cmd/consumer", may: []string{"cmd/consumer/consumercli"}, why: "the production binary: the CLI alone"},
	{pkg: "cmd/consumer/consumercli/example-service", may: []string{".", "cmd/consumer/consumercli"},
		why: "a service's own binary, built on the CLI"},
	{pkg: "cmd/consumer-dev/...", may: []string{"..."},
		why: "the developers' command (benchmarks, demo): may reach anything, and nothing imports it"},

	// Packages with tests only.
	{pkg: "docs", why: "the documentation's tests"},
}

// cat joins groups of names.
func cat(groups ...[]string) []string { return slices.Concat(groups...) }

// matches reports whether the module-relative package name p matches
// pattern (a name, or a tree ending in "/...", or "..." for every package).
func matches(pattern, p string) bool {
	if pattern == "..." {
		return true
	}
	if tree, ok := strings.CutSuffix(pattern, "/..."); ok {
		return p == tree || strings.HasPrefix(p, tree+"/")
	}
	return p == pattern
}

// refuses reports whether the entry n of a row's not list names import
// path imp: a module-relative name or tree, or, when its first element has
// a dot, the path of another module's package or tree.
func refuses(n, imp string) bool {
	if first, _, _ := strings.Cut(n, "/"); strings.Contains(first, ".") && first != "." {
		return imp == n || strings.HasPrefix(imp, n+"/")
	}
	dep, in := rel(imp)
	return in && matches(n, dep)
}

// rel returns the module-relative name of import path imp, and whether it
// belongs to the module.
func rel(imp string) (string, bool) {
	if imp == module {
		return ".", true
	}
	r, ok := strings.CutPrefix(imp, module+"/")
	return r, ok
}

// TestImportRules checks every package of the module against the table:
// each matches exactly one row, imports from the module only what the row
// allows, and nothing the row forbids. It reads the non-test imports (tests
// may import the test helpers anywhere). Every row must match a package, so
// the table cannot keep a layer that no longer exists.
func TestImportRules(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}: {{join .Imports \" \"}}", module+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	used := make([]bool, len(rules))
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, imports, _ := strings.Cut(line, ": ")
		pkg, _ := rel(path)
		var r *rule
		for i := range rules {
			if matches(rules[i].pkg, pkg) {
				if r != nil {
					t.Errorf("%s matches two rows, %q and %q: make the table say one thing", pkg, r.pkg, rules[i].pkg)
				}
				r, used[i] = &rules[i], true
			}
		}
		if r == nil {
			t.Errorf("%s has no row in the import rules (internal/layers/layers_test.go): add one that says what it may import", pkg)
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if slices.ContainsFunc(r.not, func(n string) bool { return refuses(n, imp) }) {
				t.Errorf("%s imports %s, which its row (%q: %s) forbids", pkg, imp, r.pkg, r.why)
				continue
			}
			dep, in := rel(imp)
			if !in {
				continue
			}
			if !slices.ContainsFunc(r.may, func(m string) bool { return matches(m, dep) }) {
				t.Errorf("%s imports %s, which its row (%q: %s) does not allow: import a lower layer, or change the table and say why",
					pkg, dep, r.pkg, r.why)
			}
		}
	}
	for i, u := range used {
		if !u {
			t.Errorf("the row %q matches no package: remove it", rules[i].pkg)
		}
	}
}
