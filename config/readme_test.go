package config

import (
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/pgevents/pgevents"
)

// readmeDefaults are the keys whose default the README states in words,
// and those words.
var readmeDefaults = map[string]string{
	"groupId":     "required",
	"databaseUrl": "—",
	"schema":      "first schema of the search_path",
	"channel":     "the topic's",
	"handlers":    "—",
	"maxConns":    fmt.Sprintf("partitions + %d per group", pgevents.PoolSize(0)),
}

// TestReadmeReference: every key of the file is in the README's
// configuration reference with the default Default() gives it, and every
// relay key is in the relay table. A key added, renamed or given another
// default without the README fails here.
func TestReadmeReference(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	start := strings.Index(readme, "## Configuration reference")
	end := strings.Index(readme[start+1:], "\n## ")
	if start < 0 || end < 0 {
		t.Fatal("README has no configuration reference section")
	}
	section := readme[start : start+1+end]
	documented := map[string]string{} // key -> default as written
	relay := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(strings.ReplaceAll(line, `\|`, "/"), "|")
		if len(cells) < 4 || !strings.Contains(cells[1], "`") {
			continue
		}
		keys := strings.Split(cells[1], ",")
		if len(cells) == 6 { // the relay table: key | type | default | meaning
			for _, k := range keys {
				relay[strings.Trim(strings.TrimSpace(k), "`")] = true
			}
			continue
		}
		defaults := []string{strings.TrimSpace(cells[2])}
		if len(keys) > 1 {
			defaults = strings.Split(cells[2], ",")
		}
		if len(defaults) != len(keys) {
			t.Errorf("README row %q: %d keys but %d defaults", line, len(keys), len(defaults))
			continue
		}
		for i, k := range keys {
			documented[strings.Trim(strings.TrimSpace(k), "`")] = strings.ReplaceAll(strings.TrimSpace(defaults[i]), "`", "")
		}
	}

	def := Default()
	v := reflect.ValueOf(def)
	for i := range v.NumField() {
		key := v.Type().Field(i).Tag.Get("yaml")
		if key == "" || key == keyGroups {
			continue
		}
		got, ok := documented[key]
		if !ok {
			t.Errorf("key %s is missing from the README's configuration reference", key)
			continue
		}
		want, special := readmeDefaults[key]
		if !special {
			switch f := v.Field(i); f.Kind() {
			case reflect.Int:
				want = strconv.Itoa(int(f.Int()))
			case reflect.Bool:
				want = strconv.FormatBool(f.Bool())
			case reflect.String:
				want = f.String()
				if want == "" {
					want = "none"
				}
			default:
				continue
			}
		}
		if got != want {
			t.Errorf("README: %s defaults to %q, the code to %q", key, got, want)
		}
	}
	for k := range handlerKeyTypes {
		if k != "statement" && k != "output" && !relay[k] {
			t.Errorf("relay key %s is missing from the README's relay table", k)
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
