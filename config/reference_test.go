package config

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/sink/kafkasink"
	"github.com/pgevents/pgevents/sink/webhook"
)

// referencePath is the configuration reference, whose section
// "## Configuration" documents every key of the file.
const referencePath = "../docs/reference.md"

// referenceDefaults are the keys whose default the reference states in
// words (or that Default() does not hold), and those words.
var referenceDefaults = map[string]string{
	"databaseUrl":                  "—",
	"schema":                       "first schema of the search_path",
	"groupId":                      "required",
	"channel":                      "the topic's",
	"maxConns":                     fmt.Sprintf("partitions + %d per group", pgevents.PoolSize(0)),
	"tracing.endpoint":             "the environment's, else http://localhost:4318",
	"tracing.serviceName":          DefaultTracingServiceName,
	"kafka.advertisedAddr":         "the listener's",
	"console.listen":               "required",
	"console.token":                "required",
	"handlers[].key":               kafkasink.DefaultKey,
	"handlers[].source":            kafkasink.DefaultSource,
	"handlers[].deliveryTimeoutMs": strconv.Itoa(ms(kafkasink.DefaultDeliveryTimeout)),
	"handlers[].maxRecordBytes":    strconv.Itoa(kafkasink.DefaultMaxRecordBytes),
	"handlers[].method":            webhook.DefaultMethod,
	"handlers[].timeoutMs":         strconv.Itoa(ms(webhook.DefaultTimeout)),
	"handlers[].concurrency":       strconv.Itoa(webhook.DefaultConcurrency),
}

// referenceEnv are the keys an environment variable overrides or fills
// in: the reference's environment column must name it.
var referenceEnv = map[string]string{
	keyDatabaseURL:        envDatabaseURL,
	"console.token":       EnvConsoleToken,
	"tracing.serviceName": EnvServiceName,
}

// referenceRow is a key's row in the reference.
type referenceRow struct {
	line                     int
	table                    string // the heading the table is under
	typ, def, env, handlerTy string
}

// readReference returns the rows of the reference's configuration tables
// by key, for the columns their header names.
func readReference(t *testing.T) map[string]referenceRow {
	t.Helper()
	data, err := os.ReadFile(referencePath)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]referenceRow{}
	inSection := false
	var heading string
	var columns []string
	for i, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			inSection = line == "## Configuration"
			continue
		case !inSection:
			continue
		case strings.HasPrefix(line, "### "):
			heading, columns = strings.TrimPrefix(line, "### "), nil
			continue
		case !strings.HasPrefix(line, "|"):
			columns = nil
			continue
		}
		cells := strings.Split(strings.ReplaceAll(line, `\|`, "/"), "|")
		cells = cells[1 : len(cells)-1]
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		if columns == nil {
			columns = cells
			continue
		}
		if !strings.HasPrefix(cells[0], "`") {
			continue // the header's underline
		}
		col := func(name string) string {
			if j := slices.Index(columns, name); j >= 0 && j < len(cells) {
				return strings.ReplaceAll(cells[j], "`", "")
			}
			return ""
		}
		key := strings.Trim(cells[0], "`")
		if prev, dup := rows[key]; dup {
			t.Errorf("%s:%d: key %s is documented twice (first on line %d)", referencePath, i+1, key, prev.line)
		}
		rows[key] = referenceRow{line: i + 1, table: heading,
			typ: col("type"), def: col("default"), env: col("environment"), handlerTy: col("handler types")}
	}
	if len(rows) == 0 {
		t.Fatalf("%s has no configuration tables under ## Configuration", referencePath)
	}
	return rows
}

// codeKey is a key of the file, found by reflection on the yaml tags of
// Config and the types of its sections.
type codeKey struct {
	typ string        // the YAML type, as the reference spells it
	def reflect.Value // the default, when the section's default is known
}

// yamlType is how the reference spells the YAML type of a Go type.
func yamlType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Int:
		return "integer"
	case reflect.Bool:
		return "boolean"
	case reflect.Float64:
		return "number"
	case reflect.Pointer:
		if t.Elem().Kind() != reflect.Struct {
			return yamlType(t.Elem()) // optional: nil means the default
		}
		return "mapping"
	case reflect.Struct:
		return "mapping"
	case reflect.Slice:
		return "list of " + strings.TrimSuffix(yamlType(t.Elem()), "s") + "s"
	case reflect.Map:
		return "mapping of " + yamlType(t.Elem()) + "s"
	}
	return t.String()
}

// collectKeys adds the keys of the struct v under prefix, and those of its
// sections; known says whether v holds the defaults (else the keys get
// none).
func collectKeys(keys map[string]codeKey, prefix string, v reflect.Value, known bool) {
	for i := range v.NumField() {
		f := v.Type().Field(i)
		name := f.Tag.Get("yaml")
		if name == "" || !f.IsExported() {
			continue
		}
		key := prefix + name
		keys[key] = codeKey{typ: yamlType(f.Type)}
		if known {
			keys[key] = codeKey{typ: yamlType(f.Type), def: v.Field(i)}
		}
		switch ft := f.Type; {
		case key == keyGroups:
			// A groups item sets the keys groupKeys lists.
			for _, g := range groupKeys {
				gf, _ := ft.Elem().FieldByNameFunc(func(n string) bool {
					sf, _ := ft.Elem().FieldByName(n)
					return sf.Tag.Get("yaml") == g
				})
				keys["groups[]."+g] = codeKey{typ: yamlType(gf.Type)}
			}
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			collectKeys(keys, key+"[].", reflect.New(ft.Elem()).Elem(), false)
		case ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct:
			if sub := v.Field(i); known && !sub.IsNil() {
				collectKeys(keys, key+".", sub.Elem(), true)
			} else {
				collectKeys(keys, key+".", reflect.New(ft.Elem()).Elem(), false)
			}
		}
	}
}

// fileKeys returns every key of the file, with the defaults of the top
// level and of the sections whose defaults are known.
func fileKeys() map[string]codeKey {
	c := Default()
	c.Kafka = defaultKafka()
	c.Console = &Console{}
	c.Tracing = &Tracing{SampleRatio: DefaultTracingSampleRatio}
	keys := map[string]codeKey{}
	collectKeys(keys, "", reflect.ValueOf(c), true)
	return keys
}

// defaultString is how the reference writes the default v.
func defaultString(v reflect.Value) (string, bool) {
	switch v.Kind() {
	case reflect.Int:
		return strconv.Itoa(int(v.Int())), true
	case reflect.Bool:
		return strconv.FormatBool(v.Bool()), true
	case reflect.Float64:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64), true
	case reflect.String:
		if v.String() == "" {
			return "none", true
		}
		return v.String(), true
	}
	return "", false
}

// TestConfigReference: the reference's configuration tables and the
// file's keys are the same set, in both directions, each key with its
// YAML type, the default the code gives it and the environment variable
// that overrides it; every relay key is in the relay table with the
// handler types that take it. A key added, renamed, removed or given
// another default or type without the reference fails here.
func TestConfigReference(t *testing.T) {
	rows := readReference(t)
	keys := fileKeys()

	for key, k := range keys {
		row, ok := rows[key]
		if !ok {
			t.Errorf("key %s (%s) is missing from %s#configuration", key, k.typ, referencePath)
			continue
		}
		where := fmt.Sprintf("%s:%d: %s", referencePath, row.line, key)
		if row.typ != k.typ {
			t.Errorf("%s: type %q, the code's is %q", where, row.typ, k.typ)
		}
		want, special := referenceDefaults[key]
		if !special && k.def.IsValid() {
			if want, special = defaultString(k.def); special && row.def != want {
				t.Errorf("%s: default %q, the code's is %q", where, row.def, want)
			}
		} else if special && row.def != want {
			t.Errorf("%s: default %q, the code's is %q", where, row.def, want)
		}
		if env, ok := referenceEnv[key]; ok && !strings.Contains(row.env, env) {
			t.Errorf("%s: the environment column does not name %s", where, env)
		}
	}
	for key, row := range rows {
		if _, ok := keys[key]; !ok {
			t.Errorf("%s:%d: key %s is documented, but the configuration has no such key", referencePath, row.line, key)
		}
	}

	for k, types := range handlerKeyTypes {
		if !slices.Contains(types, handlerKafka) && !slices.Contains(types, handlerHTTP) {
			continue // a key of sql or log handlers, under Handlers
		}
		row, ok := rows["handlers[]."+k]
		if !ok {
			continue // reported above
		}
		if row.table != "Relay keys" {
			t.Errorf("%s:%d: relay key handlers[].%s is under %q, not in the relay table", referencePath, row.line, k, row.table)
			continue
		}
		if got, want := row.handlerTy, strings.Join(types, ", "); got != want {
			t.Errorf("%s:%d: relay key handlers[].%s is for types %q, the code's are %q", referencePath, row.line, k, got, want)
		}
	}
	for key, row := range rows {
		k, ok := strings.CutPrefix(key, "handlers[].")
		if ok && row.table == "Relay keys" && handlerKeyTypes[k] == nil {
			t.Errorf("%s:%d: %s is in the relay table, but is no relay key", referencePath, row.line, key)
		}
	}
}

// TestPoolOptions: the file's session timeouts reach the pool, 0 as the
// server's setting, and the pool is as large as its groups need.
func TestPoolOptions(t *testing.T) {
	c := Default()
	if o := c.PoolOptions(); o.StatementTimeout != pgevents.DefaultStatementTimeout || o.IdleInTransactionTimeout != pgevents.DefaultIdleInTransactionTimeout {
		t.Errorf("default PoolOptions %+v", o)
	}
	c.StatementTimeoutMs, c.IdleInTransactionTimeoutMs = 0, 0
	if o := c.PoolOptions(); o.StatementTimeout != pgevents.ServerSetting || o.IdleInTransactionTimeout != pgevents.ServerSetting {
		t.Errorf("0 must leave the server's setting: %+v", o)
	}
	c.Groups = []Config{{TotalPartitions: 8, PartitionID: -1}, {TotalPartitions: 8, PartitionID: 3}}
	if got, want := c.PoolSize(), pgevents.PoolSize(8)+pgevents.PoolSize(1); got != want {
		t.Errorf("PoolSize of two groups = %d, want %d", got, want)
	}
}
