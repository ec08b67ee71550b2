package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/sink"
	"github.com/pgevents/pgevents/sink/kafkasink"
	"github.com/pgevents/pgevents/sink/webhook"
)

// TestConsumerKeysMatchConfig: every key the file maps to pgevents.Config
// is a key of the file and a field of pgevents.Config, and the file
// refuses a 0 exactly for the fields whose zero pgevents.Config replaces
// with a default (so the table cannot drift from the root's defaults).
func TestConsumerKeysMatchConfig(t *testing.T) {
	defaulted := reflect.ValueOf(pgevents.Config{}.WithDefaults())
	for _, k := range consumerKeys {
		if fieldRank(k.key) == fieldRank("no such key") {
			t.Errorf("%s is not a key of the file", k.key)
		}
		f := defaulted.FieldByName(k.field)
		if !f.IsValid() {
			t.Errorf("%s maps to %s, which is not a field of pgevents.Config", k.key, k.field)
			continue
		}
		if hasDefault := !f.IsZero(); hasDefault != k.zeroDefault {
			t.Errorf("%s: zeroDefault %v, but pgevents.Config.WithDefaults gives %s a default: %v", k.key, k.zeroDefault, k.field, hasDefault)
		}
	}
}

// ownerMsg returns the message of the error about field (a
// pgevents.Config field, or a relay option's path) in err, which the
// option's owner returned.
func ownerMsg(t *testing.T, err error, field string) string {
	t.Helper()
	for _, e := range split(err) {
		var ce *pgevents.ConfigError
		var oe *sink.OptionError
		switch {
		case errors.As(e, &ce) && ce.Field == field:
			return fieldNames.Replace(ce.Msg)
		case errors.As(e, &oe) && oe.Path() == field:
			return oe.Msg
		}
	}
	t.Fatalf("the owner does not refuse %s: %v", field, err)
	return ""
}

// TestRulesAreTheOwners: a value the file refuses because of a rule of
// pgevents.Config or of a relay is refused with that rule's own message,
// under the file's key: the file maps to the option and reports what its
// owner says, it does not restate the rule.
func TestRulesAreTheOwners(t *testing.T) {
	clearEnv(t)
	const head = "databaseUrl: x\ngroupId: g\n"
	const handler = "handlers:\n  - eventType: \"*\"\n"
	ok := pgevents.Config{GroupID: "g", TotalPartitions: 8}
	with := func(f func(c *pgevents.Config)) error { c := ok; f(&c); return c.Validate() }
	kafkaOK := kafkasink.Options{Brokers: []string{"k:9092"}, Topic: "t"}
	for _, tt := range []struct {
		name, src, key, want string
	}{
		{"batchSize", head + "batchSize: -1\n", "batchSize",
			ownerMsg(t, with(func(c *pgevents.Config) { c.BatchSize = -1 }), "BatchSize")},
		{"long groupId", "databaseUrl: x\ngroupId: " + strings.Repeat("g", 201) + "\n", "groupId",
			ownerMsg(t, with(func(c *pgevents.Config) { c.GroupID = strings.Repeat("g", 201) }), "GroupID")},
		{"reserved channel", head + "channel: select\n", "channel",
			ownerMsg(t, with(func(c *pgevents.Config) { c.Channel = "select" }), "Channel")},
		{"too many partitions", head + "totalPartitions: 2000\n", "totalPartitions",
			ownerMsg(t, with(func(c *pgevents.Config) { c.TotalPartitions = 2000 }), "TotalPartitions")},
		{"retryMax below retryInitial", head + "retryInitialMs: 500\nretryMaxMs: 400\n", "retryMaxMs",
			ownerMsg(t, with(func(c *pgevents.Config) { c.RetryInitial, c.RetryMax = 500e6, 400e6 }), "RetryMax")},
		{"partition outside the count", head + "totalPartitions: 4\npartitionId: 4\n", "partitionId",
			ownerMsg(t, with(func(c *pgevents.Config) { c.TotalPartitions, c.Partitions = 4, []int{4} }), "Partitions")},
		{"in a group", "databaseUrl: x\ngroups:\n  - groupId: a\n  - groupId: b\n    batchSize: -1\n", "groups[1].batchSize",
			ownerMsg(t, with(func(c *pgevents.Config) { c.BatchSize = -1 }), "BatchSize")},
		{"kafka record size", head + handler + "    type: kafka\n    brokers: [k:9092]\n    topic: t\n    maxRecordBytes: 100\n",
			"handlers[0].maxRecordBytes",
			ownerMsg(t, func() kafkasink.Options { o := kafkaOK; o.MaxRecordBytes = 100; return o }().Validate(), "maxRecordBytes")},
		{"kafka broker", head + handler + "    type: kafka\n    brokers: [k:9092, kafka]\n    topic: t\n", "handlers[0].brokers[1]",
			ownerMsg(t, kafkasink.Options{Brokers: []string{"k:9092", "kafka"}, Topic: "t"}.Validate(), "brokers[1]")},
		{"kafka topic name", head + handler + "    type: kafka\n    brokers: [k:9092]\n    topic: a/b\n", "handlers[0].topic",
			ownerMsg(t, kafkasink.Options{Brokers: []string{"k:9092"}, Topic: "a/b"}.Validate(), "topic")},
		{"webhook method", head + handler + "    type: http\n    url: http://x\n    method: \"GET /\"\n", "handlers[0].method",
			ownerMsg(t, webhook.Options{URL: "http://x", Method: "GET /"}.Validate(), "method")},
		{"webhook header", head + handler + "    type: http\n    url: http://x\n    headers: {\"X Bad\": v}\n", "handlers[0].headers.X Bad",
			ownerMsg(t, webhook.Options{URL: "http://x", Headers: map[string]string{"X Bad": "v"}}.Validate(), "headers.X Bad")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := parseErr(t, tt.src)
			if e.Key != tt.key || e.Msg != tt.want {
				t.Fatalf("error %q at %s, want the owner's %q at %s", e.Msg, e.Key, tt.want, tt.key)
			}
		})
	}
}

// TestZeroIsRefusedWhereGoDefaults: a key set to 0 (or "") in the file
// whose pgevents.Config field would take its default for it is refused,
// naming the key: in the file, leaving the key out is how to get the
// default.
func TestZeroIsRefusedWhereGoDefaults(t *testing.T) {
	clearEnv(t)
	for _, k := range consumerKeys {
		if !k.zeroDefault {
			continue
		}
		value, want := "0", "must be greater than 0, got 0"
		if k.key == "startFrom" {
			value, want = `""`, "must not be empty"
		}
		e := parseErr(t, "databaseUrl: x\ngroupId: g\n"+k.key+": "+value+"\n")
		if e.Key != k.key || e.Msg != want {
			t.Errorf("%s: %s: error %v, want %q", k.key, value, e, want)
		}
	}
}

// TestGoHandlers: a handler of type go names the Go handler it runs, and
// takes no key of the other types.
func TestGoHandlers(t *testing.T) {
	clearEnv(t)
	const head = "databaseUrl: x\ngroupId: g\nhandlers:\n  - eventType: order.placed\n    type: go\n"
	c := mustParse(t, head+"    name: invoices\n")
	if h := c.Handlers[0]; h.Type != "go" || h.Name != "invoices" {
		t.Fatalf("handler %+v, want type go named invoices", h)
	}
	for src, key := range map[string]string{
		head: "handlers[0].name",
		head + "    name: x\n    statement: SELECT 1\n": "handlers[0].statement",
		head + "    name: x\n    url: http://x\n":       "handlers[0].url",
	} {
		if e := parseErr(t, src); e.Key != key {
			t.Errorf("error %v, want one naming %s", e, key)
		}
	}
}

// TestConsumerError: an error of pgevents.NewConsumer names the file's key
// behind it: the group's own key in groups[i], a key the groups share at
// the top level, and handlers for a group without any.
func TestConsumerError(t *testing.T) {
	clearEnv(t)
	grouped := mustParse(t, "databaseUrl: x\ngroups:\n  - groupId: a\n  - groupId: b\n")
	single := mustParse(t, "databaseUrl: x\ngroupId: g\n")
	for _, tt := range []struct {
		cfg   *Config
		group int
		edit  func(c *pgevents.Config)
		key   string
	}{
		{grouped, 1, func(c *pgevents.Config) {}, "groups[1].handlers"},
		{grouped, 1, func(c *pgevents.Config) { c.WaitPeriod = -1 }, "waitPeriodMs"},
		{grouped, 0, func(c *pgevents.Config) { c.BatchSize = -1 }, "groups[0].batchSize"},
		{single, 0, func(c *pgevents.Config) {}, "handlers"},
	} {
		cc := tt.cfg.GroupConfigs()[tt.group].Consumer(nil, nil)
		tt.edit(&cc)
		_, err := pgevents.NewConsumer(&pgxpool.Pool{}, cc) // never used: validation comes first
		var e *Error
		if err := tt.cfg.ConsumerError(tt.group, err); !errors.As(err, &e) || e.Key != tt.key {
			t.Errorf("ConsumerError = %v, want an *Error naming %s", err, tt.key)
		}
	}
	other := errors.New("connection refused")
	if err := single.ConsumerError(0, other); err != other {
		t.Errorf("ConsumerError of another error = %v, want it unchanged", err)
	}
}
