package metrics_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/metrics"
	"github.com/pgevents/pgevents/schema"
)

var metricNameRE = regexp.MustCompile(`\bpgevents_[a-z_]+\b`)

// knownMetrics returns the names of every metric the package exposes, with
// the _bucket, _sum and _count series of its histograms.
func knownMetrics(t *testing.T) map[string]bool {
	t.Helper()
	pool := newTopic(t, 2)
	ctx := context.Background()
	if err := store.Init(ctx, pool, "g", 1, []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := pgevents.Append(ctx, pool, pgevents.Event{HostID: "h", EventType: "t"}); err != nil {
		t.Fatal(err)
	}
	m, err := metrics.New(metrics.Options{Group: "g", Partitions: []int{0, 1}, DB: pool, NoRuntimeMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	m.BatchCommitted(pgevents.BatchStats{Group: "g", Topic: 1, Handled: 1, Events: 1, EndToEnd: []time.Duration{time.Millisecond}})
	// A sequenced topic's metrics too.
	if _, _, err := schema.EnsureTopicSpec(ctx, pool, schema.TopicSpec{ID: 2, Partitions: 2, Scope: schema.ScopeSequenced}); err != nil {
		t.Fatal(err)
	}
	seq, err := metrics.New(metrics.Options{Group: "g", Topic: 2, DB: pool, NoRuntimeMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, m := range []*metrics.Metrics{m, seq} {
		for name, fam := range gather(t, m) {
			known[name] = true
			if fam.GetType().String() == "HISTOGRAM" {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					known[name+s] = true
				}
			}
		}
	}
	return known
}

// checkNames fails the test for every pgevents_ metric named in text that
// the package does not expose, and returns the names found.
func checkNames(t *testing.T, where, text string, known map[string]bool) map[string]bool {
	t.Helper()
	used := map[string]bool{}
	for _, n := range metricNameRE.FindAllString(text, -1) {
		used[n] = true
		if !known[n] {
			t.Errorf("%s: unknown metric %s", where, n)
		}
	}
	return used
}

// balanced reports whether the brackets of a PromQL expression match.
func balanced(expr string) bool {
	var stack []rune
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	inString := false
	for _, r := range expr {
		switch {
		case r == '"':
			inString = !inString
		case inString:
		case r == '(' || r == '[' || r == '{':
			stack = append(stack, r)
		case pairs[r] != 0:
			if len(stack) == 0 || stack[len(stack)-1] != pairs[r] {
				return false
			}
			stack = stack[:len(stack)-1]
		}
	}
	return len(stack) == 0 && !inString
}

func TestAlertRules(t *testing.T) {
	t.Parallel()
	known := knownMetrics(t)
	b, err := os.ReadFile("../deploy/prometheus/pgevents-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("pgevents-alerts.yml: %v", err)
	}
	if len(file.Groups) == 0 {
		t.Fatal("no rule group")
	}
	alerts := map[string]bool{}
	used := map[string]bool{}
	for _, g := range file.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: name and rules are required", g.Name)
		}
		for _, r := range g.Rules {
			if r.Alert == "" || strings.TrimSpace(r.Expr) == "" {
				t.Errorf("rule %+v: alert and expr are required", r)
				continue
			}
			if alerts[r.Alert] {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			alerts[r.Alert] = true
			if !balanced(r.Expr) {
				t.Errorf("alert %s: unbalanced brackets in %q", r.Alert, r.Expr)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("alert %s: for: %v", r.Alert, err)
				}
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: severity, summary and description are required", r.Alert)
			}
			for n := range checkNames(t, "alert "+r.Alert, r.Expr, known) {
				used[n] = true
			}
		}
	}
	// The alerts the issue asks for.
	for _, metric := range []string{"pgevents_consumer_lag_seconds", "pgevents_dead_letters_total", "pgevents_partitions_owned",
		"pgevents_topic_partitions", "pgevents_listener_reconnects_total", "pgevents_listener_connected",
		"pgevents_notification_queue_usage", "pgevents_partition_halted", "pgevents_consumer_next_offset",
		"pgevents_sequencer_staged_events", "pgevents_sequencer_last_tick_age_seconds"} {
		if !used[metric] {
			t.Errorf("no alert uses %s", metric)
		}
	}
	if !alerts["PgeventsConsumerDown"] {
		t.Error("no alert on up == 0")
	}
}

func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	known := knownMetrics(t)
	b, err := os.ReadFile("../deploy/grafana/pgevents-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	}
	type panel struct {
		ID      int      `json:"id"`
		Type    string   `json:"type"`
		Title   string   `json:"title"`
		Targets []target `json:"targets"`
		GridPos struct {
			H, W, X, Y int
		} `json:"gridPos"`
	}
	var dash struct {
		UID           string  `json:"uid"`
		Title         string  `json:"title"`
		SchemaVersion int     `json:"schemaVersion"`
		Panels        []panel `json:"panels"`
		Templating    struct {
			List []struct {
				Name string `json:"name"`
				Type string `json:"type"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("pgevents-dashboard.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" || dash.SchemaVersion == 0 {
		t.Fatalf("uid, title and schemaVersion are required: %q %q %d", dash.UID, dash.Title, dash.SchemaVersion)
	}
	vars := map[string]bool{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
	}
	for _, v := range []string{"datasource", "group", "topic"} {
		if !vars[v] {
			t.Errorf("template variable $%s missing", v)
		}
	}
	ids := map[int]bool{}
	used := map[string]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W == 0 {
			t.Errorf("panel %q: gridPos %+v out of the 24-column grid", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if !balanced(tg.Expr) || tg.RefID == "" {
				t.Errorf("panel %q: bad target %+v", p.Title, tg)
			}
			for n := range checkNames(t, "panel "+p.Title, tg.Expr, known) {
				used[n] = true
			}
		}
	}
	for _, metric := range []string{"pgevents_consumer_lag_events", "pgevents_consumer_lag_seconds", "pgevents_events_handled_total",
		"pgevents_end_to_end_latency_seconds_bucket", "pgevents_batch_size_bucket", "pgevents_retries_total",
		"pgevents_dead_letters_total", "pgevents_wakeups_total", "pgevents_listener_reconnects_total",
		"pgevents_notification_queue_usage", "pgevents_partitions_owned"} {
		if !used[metric] {
			t.Errorf("no panel shows %s", metric)
		}
	}
}

// TestDocNamesEveryMetric: the package documentation describes every
// metric the package exposes.
func TestDocNamesEveryMetric(t *testing.T) {
	t.Parallel()
	known := knownMetrics(t)
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for name := range known {
		if strings.HasSuffix(name, "_bucket") || strings.HasSuffix(name, "_sum") || strings.HasSuffix(name, "_count") {
			continue
		}
		if !strings.Contains(doc, name) {
			t.Errorf("doc.go does not describe %s", name)
		}
	}
	checkNames(t, "doc.go", doc, known)
}
