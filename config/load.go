package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Load reads the configuration file at path and parses it with [Parse]. Any
// error is an [*Error] whose File is path; a file that cannot be read
// yields an *Error with an empty Key that unwraps to the cause.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		msg := err.Error()
		var pathErr *fs.PathError
		if errors.As(err, &pathErr) {
			msg = pathErr.Err.Error()
		}
		return nil, &Error{File: path, Msg: "cannot read file: " + msg, err: err}
	}
	c, err := Parse(data)
	if err != nil {
		var cfgErr *Error
		if errors.As(err, &cfgErr) {
			cfgErr.File = path
		}
		return nil, err
	}
	for i := range c.warnings {
		c.warnings[i].File = path
	}
	return c, nil
}

// Parse decodes the YAML content of a configuration file, applies defaults
// and the DATABASE_URL override, and validates the result. Any error is an
// [*Error] naming the first offending key; see the package documentation
// for the order in which problems are reported.
func Parse(data []byte) (*Config, error) {
	root, cfgErr := decodeDocument(data)
	if cfgErr != nil {
		return nil, cfgErr
	}

	p := parser{cfg: Default(), lines: make(map[string]int)}
	if cfgErr := p.topLevel(root); cfgErr != nil {
		return nil, cfgErr
	}

	if url := os.Getenv(envDatabaseURL); url != "" {
		p.cfg.DatabaseURL = url
	}
	p.cfg.consoleEnv()
	defaultOutputs(p.cfg.Handlers)
	for i := range p.cfg.Groups {
		g := &p.cfg.Groups[i]
		if g.DatabaseURL == "" { // the group sets none: the top level's, after DATABASE_URL
			g.DatabaseURL = p.cfg.DatabaseURL
		}
		defaultOutputs(g.Handlers)
	}

	problems := p.cfg.problems()
	if len(problems) > 0 {
		for _, e := range problems {
			e.Line = p.lineOf(e.Key)
		}
		// Document order; problems without a line (missing keys) last.
		// The sort is stable, so ties keep field order.
		slices.SortStableFunc(problems, func(a, b *Error) int {
			return cmp.Or(
				cmp.Compare(lineRank(a.Line), lineRank(b.Line)),
				cmp.Compare(a.Line, b.Line),
			)
		})
		return nil, problems[0]
	}

	if p.cfg.Console != nil {
		p.cfg.Console.tokenLine = p.lineOf(keyConsole + ".token")
	}
	p.kafkaLines()
	c := p.cfg
	return &c, nil
}

// defaultOutputs sets the output of log handlers that give none.
func defaultOutputs(hs []Handler) {
	for i := range hs {
		if hs[i].Type == handlerLog && hs[i].Output == "" {
			hs[i].Output = outputStdout
		}
	}
}

func lineRank(line int) int {
	if line == 0 {
		return 1
	}
	return 0
}

// decodeDocument parses data as a single YAML document and returns its top
// level mapping.
func decodeDocument(data []byte) (*yaml.Node, *Error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{Msg: "file is empty"}
		}
		return nil, &Error{Msg: "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: "), err: err}
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, &Error{Msg: "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: "), err: err}
	default:
		return nil, &Error{Line: extra.Line, Msg: "file must hold a single YAML document"}
	}

	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil, &Error{Msg: "file is empty"}
		}
		root = root.Content[0]
	}
	root = resolve(root)
	if isNull(root) {
		return nil, &Error{Msg: "file is empty"}
	}
	if root.Kind != yaml.MappingNode {
		return nil, &Error{Line: root.Line, Msg: "top level must be a mapping of keys to values, got " + describe(root)}
	}
	return root, nil
}

// parser fills a Config from a YAML node tree, remembering the line of
// every key it sees so that validation problems can be located.
type parser struct {
	cfg   Config
	lines map[string]int // key path → line of the key
}

// warn records a warning about key, at line, in the configuration.
func (p *parser) warn(key string, line int, msg string) {
	p.cfg.warnings = append(p.cfg.warnings, Warning{Key: key, Line: line, Msg: msg})
}

// lineOf returns the line of key, or of the nearest enclosing key present
// in the file, or 0.
func (p *parser) lineOf(key string) int {
	for {
		if line, ok := p.lines[key]; ok {
			return line
		}
		i := strings.LastIndexAny(key, ".[")
		if i <= 0 {
			return 0
		}
		key = key[:i]
	}
}

type topField func(c *Config, v *yaml.Node) string

func intField(get func(c *Config) *int) topField {
	return func(c *Config, v *yaml.Node) string { return decodeInt(v, get(c)) }
}

func stringField(get func(c *Config) *string) topField {
	return func(c *Config, v *yaml.Node) string { return decodeString(v, get(c)) }
}

// topFields maps every known top-level key except handlers to its decoder.
var topFields = map[string]topField{
	"databaseUrl":       stringField(func(c *Config) *string { return &c.DatabaseURL }),
	"schema":            stringField(func(c *Config) *string { return &c.Schema }),
	"groupId":           stringField(func(c *Config) *string { return &c.GroupID }),
	"topicId":           intField(func(c *Config) *int { return &c.TopicID }),
	"batchSize":         intField(func(c *Config) *int { return &c.BatchSize }),
	"totalPartitions":   intField(func(c *Config) *int { return &c.TotalPartitions }),
	"partitionId":       intField(func(c *Config) *int { return &c.PartitionID }),
	"waitPeriodMs":      intField(func(c *Config) *int { return &c.WaitPeriodMs }),
	"channel":           stringField(func(c *Config) *string { return &c.Channel }),
	"logLevel":          stringField(func(c *Config) *string { return &c.LogLevel }),
	"logFormat":         stringField(func(c *Config) *string { return &c.LogFormat }),
	"unknownEventType":  stringField(func(c *Config) *string { return &c.UnknownEventType }),
	"maxConns":          intField(func(c *Config) *int { return &c.MaxConns }),
	"shutdownTimeoutMs": intField(func(c *Config) *int { return &c.ShutdownTimeoutMs }),
	"retryInitialMs":    intField(func(c *Config) *int { return &c.RetryInitialMs }),
	"retryMaxMs":        intField(func(c *Config) *int { return &c.RetryMaxMs }),
	"maxAttempts":       intField(func(c *Config) *int { return &c.MaxAttempts }),

	"onPermanentFailure":         stringField(func(c *Config) *string { return &c.OnPermanentFailure }),
	"maxDeadLetterRate":          intField(func(c *Config) *int { return &c.MaxDeadLetterRate }),
	"deadLetterWindowMs":         intField(func(c *Config) *int { return &c.DeadLetterWindowMs }),
	"handlerTimeoutMs":           intField(func(c *Config) *int { return &c.HandlerTimeoutMs }),
	"statementTimeoutMs":         intField(func(c *Config) *int { return &c.StatementTimeoutMs }),
	"idleInTransactionTimeoutMs": intField(func(c *Config) *int { return &c.IdleInTransactionTimeoutMs }),

	"leaseMs": intField(func(c *Config) *int { return &c.LeaseMs }),

	"startFrom":                 stringField(func(c *Config) *string { return &c.StartFrom }),
	"deadAfterMs":               intField(func(c *Config) *int { return &c.DeadAfterMs }),
	"maintenanceIntervalMs":     intField(func(c *Config) *int { return &c.MaintenanceIntervalMs }),
	"retention":                 stringField(func(c *Config) *string { return &c.Retention }),
	"maxRetention":              stringField(func(c *Config) *string { return &c.MaxRetention }),
	"zeroSubscriptionRetention": stringField(func(c *Config) *string { return &c.ZeroSubscriptionRetention }),
	"idempotencyWindow":         stringField(func(c *Config) *string { return &c.IdempotencyWindow }),
	"segmentSize":               intField(func(c *Config) *int { return &c.SegmentSize }),
	"offsetAllocation":          stringField(func(c *Config) *string { return &c.OffsetAllocation }),
	"offsetScope":               stringField(func(c *Config) *string { return &c.OffsetScope }),
	"metricsAddr":               stringField(func(c *Config) *string { return &c.MetricsAddr }),
	"pprof":                     boolField(func(c *Config) *bool { return &c.Pprof }),
}

const keyHandlers = "handlers"

// handlerFields maps every known string handler key to its field.
var handlerFields = map[string]func(h *Handler) *string{
	"eventType": func(h *Handler) *string { return &h.EventType },
	"type":      func(h *Handler) *string { return &h.Type },
	"statement": func(h *Handler) *string { return &h.Statement },
	"output":    func(h *Handler) *string { return &h.Output },
	"name":      func(h *Handler) *string { return &h.Name },
	"format":    func(h *Handler) *string { return &h.Format },
	"source":    func(h *Handler) *string { return &h.Source },
	"topic":     func(h *Handler) *string { return &h.Topic },
	"key":       func(h *Handler) *string { return &h.Key },
	"url":       func(h *Handler) *string { return &h.URL },
	"method":    func(h *Handler) *string { return &h.Method },
}

// handlerInts maps every integer handler key to its field.
var handlerInts = map[string]func(h *Handler) *int{
	"deliveryTimeoutMs": func(h *Handler) *int { return &h.DeliveryTimeoutMs },
	"maxRecordBytes":    func(h *Handler) *int { return &h.MaxRecordBytes },
	"timeoutMs":         func(h *Handler) *int { return &h.TimeoutMs },
	"concurrency":       func(h *Handler) *int { return &h.Concurrency },
}

// handlerKeyTypes lists, for each handler key but eventType and type, the
// handler types that take it.
var handlerKeyTypes = map[string][]string{
	"statement": {handlerSQL}, "prepareAtStart": {handlerSQL}, "output": {handlerLog},
	"name": {handlerKafka, handlerHTTP, handlerGo}, "format": {handlerKafka, handlerHTTP}, "source": {handlerKafka, handlerHTTP},
	"tls": {handlerKafka, handlerHTTP}, "brokers": {handlerKafka}, "topic": {handlerKafka}, "key": {handlerKafka},
	"sasl": {handlerKafka}, "deliveryTimeoutMs": {handlerKafka}, "maxRecordBytes": {handlerKafka},
	"url": {handlerHTTP}, "method": {handlerHTTP}, "headers": {handlerHTTP}, "timeoutMs": {handlerHTTP},
	"concurrency": {handlerHTTP},
}

// setKeys returns the handler keys h sets, besides eventType and type.
func (h *Handler) setKeys() []string {
	var keys []string
	for k, f := range handlerFields {
		if k != "eventType" && k != "type" && *f(h) != "" {
			keys = append(keys, k)
		}
	}
	for k, f := range handlerInts {
		if *f(h) != 0 {
			keys = append(keys, k)
		}
	}
	if h.TLS != nil {
		keys = append(keys, "tls")
	}
	if h.SASL != nil {
		keys = append(keys, "sasl")
	}
	if h.Brokers != nil {
		keys = append(keys, "brokers")
	}
	if h.Headers != nil {
		keys = append(keys, "headers")
	}
	if h.PrepareAtStart != nil {
		keys = append(keys, "prepareAtStart")
	}
	slices.Sort(keys)
	return keys
}

// handlerKey decodes the value v of handler key name (at key path) into h.
func (p *parser) handlerKey(h *Handler, path, name string, k, v *yaml.Node) *Error {
	key := path + "." + name
	fail := func(msg string) *Error { return &Error{Key: key, Line: k.Line, Msg: msg} }
	if field, ok := handlerFields[name]; ok {
		if msg := decodeString(v, field(h)); msg != "" {
			return fail(msg)
		}
		return nil
	}
	if field, ok := handlerInts[name]; ok {
		if msg := decodeInt(v, field(h)); msg != "" {
			return fail(msg)
		}
		return nil
	}
	switch name {
	case "prepareAtStart":
		var b bool
		if msg := decodeBool(v, &b); msg != "" {
			return fail(msg)
		}
		h.PrepareAtStart = &b
		return nil
	case "brokers":
		if v.Kind != yaml.SequenceNode {
			return fail("must be a list of host:port, got " + describe(v))
		}
		h.Brokers = []string{}
		for i, item := range v.Content {
			var b string
			if msg := decodeString(resolve(item), &b); msg != "" {
				return &Error{Key: fmt.Sprintf("%s[%d]", key, i), Line: item.Line, Msg: msg}
			}
			h.Brokers = append(h.Brokers, b)
		}
		return nil
	case "headers":
		return p.headers(key, k, v, &h.Headers)
	case "tls":
		if v.Kind != yaml.MappingNode && !isNull(v) {
			return fail("must be a mapping (caFile, certFile, keyFile), got " + describe(v))
		}
		h.TLS = &TLS{}
		fields := map[string]*string{"caFile": &h.TLS.CAFile, "certFile": &h.TLS.CertFile, "keyFile": &h.TLS.KeyFile}
		if isNull(v) {
			return nil
		}
		return p.subFields(v, key, fields, nil)
	case "sasl":
		if v.Kind != yaml.MappingNode {
			return fail("must be a mapping (mechanism, user, password), got " + describe(v))
		}
		h.SASL = &SASL{}
		fields := map[string]*string{"mechanism": &h.SASL.Mechanism, "user": &h.SASL.User, "password": &h.SASL.Password}
		return p.subFields(v, key, fields, map[string]bool{"password": true})
	}
	return fail("unknown key")
}

// subFields decodes the string keys of mapping v (at key path) into
// fields; the keys in env may name environment variables as ${NAME}.
func (p *parser) subFields(v *yaml.Node, key string, fields map[string]*string, env map[string]bool) *Error {
	return p.mapping(v, key+".", func(name string, k, v *yaml.Node) *Error {
		dst, ok := fields[name]
		if !ok {
			names := slices.Sorted(maps.Keys(fields))
			return &Error{Key: key + "." + name, Line: k.Line, Msg: "unknown key (" + strings.Join(names, ", ") + ")"}
		}
		if msg := decodeString(v, dst); msg != "" {
			return &Error{Key: key + "." + name, Line: k.Line, Msg: msg}
		}
		if env[name] {
			value, err := expandEnv(*dst)
			if err != nil {
				return &Error{Key: key + "." + name, Line: k.Line, Msg: err.Error()}
			}
			*dst = value
		}
		return nil
	})
}

// headers decodes the mapping v of the key key (named at k) into *dst: a
// handler's and the tracing section's headers, each value a string that
// may name environment variables (expandEnv). An error names the key of
// the header at fault.
func (p *parser) headers(key string, k, v *yaml.Node, dst *map[string]string) *Error {
	if v.Kind != yaml.MappingNode {
		return &Error{Key: key, Line: k.Line, Msg: "must be a mapping of header names to values, got " + describe(v)}
	}
	*dst = map[string]string{}
	return p.mapping(v, key+".", func(hname string, hk, hv *yaml.Node) *Error {
		var value string
		if msg := decodeString(hv, &value); msg != "" {
			return &Error{Key: key + "." + hname, Line: hk.Line, Msg: msg}
		}
		value, err := expandEnv(value)
		if err != nil {
			return &Error{Key: key + "." + hname, Line: hk.Line, Msg: err.Error()}
		}
		(*dst)[hname] = value
		return nil
	})
}

// expandEnv replaces each ${NAME} in s with the environment variable NAME,
// which must be set.
func expandEnv(s string) (string, error) {
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", fmt.Errorf("has a ${ without }")
		}
		name := s[i+2 : i+end]
		if !validEnvName(name) {
			return "", fmt.Errorf("${%s} is not an environment variable name", name)
		}
		value, ok := os.LookupEnv(name)
		if !ok {
			return "", fmt.Errorf("names the environment variable %s, which is not set", name)
		}
		b.WriteString(s[:i])
		b.WriteString(value)
		s = s[i+end+1:]
	}
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

func (p *parser) topLevel(m *yaml.Node) *Error {
	var groups *yaml.Node
	err := p.mapping(m, "", func(name string, k, v *yaml.Node) *Error {
		if name == keyGroups {
			groups = v
			return nil
		}
		if name == keyConsole {
			return p.console(v)
		}
		if name == keyTracing {
			return p.tracing(v)
		}
		if name == keyKafka {
			return p.kafka(v)
		}
		if name == keyHandlers {
			hs, err := p.handlers(v, keyHandlers)
			p.cfg.Handlers = hs
			return err
		}
		decode, ok := topFields[name]
		if !ok {
			return &Error{Key: name, Line: k.Line, Msg: "unknown key"}
		}
		if msg := decode(&p.cfg, v); msg != "" {
			return &Error{Key: name, Line: k.Line, Msg: msg}
		}
		return nil
	})
	if err != nil || groups == nil {
		return err
	}
	return p.groups(groups)
}

// groups decodes the groups list, each item over a copy of the top level.
func (p *parser) groups(v *yaml.Node) *Error {
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		return &Error{Key: keyGroups, Line: p.lines[keyGroups], Msg: "must be a list of groups, got " + describe(v)}
	}
	for i, item := range v.Content {
		item = resolve(item)
		path := keyGroups + "[" + strconv.Itoa(i) + "]"
		p.lines[path] = item.Line
		if item.Kind != yaml.MappingNode {
			return &Error{Key: path, Line: item.Line, Msg: "must be a mapping, got " + describe(item)}
		}
		g := p.cfg
		g.Groups = nil
		g.GroupID = ""
		g.DatabaseURL = "" // the top level's after DATABASE_URL, unless the group sets its own
		g.Console, g.Tracing, g.Kafka = nil, nil, nil
		g.warnings = nil
		err := p.mapping(item, path+".", func(name string, k, v *yaml.Node) *Error {
			key := path + "." + name
			if !slices.Contains(groupKeys, name) {
				return &Error{Key: key, Line: k.Line, Msg: "unknown key (a group may set " + strings.Join(groupKeys, ", ") + ")"}
			}
			if name == keyHandlers {
				hs, err := p.handlers(v, key)
				g.Handlers = hs
				return err
			}
			if msg := topFields[name](&g, v); msg != "" {
				return &Error{Key: key, Line: k.Line, Msg: msg}
			}
			if name == keyDatabaseURL && g.DatabaseURL == "" {
				return &Error{Key: key, Line: k.Line, Msg: "must not be empty: leave it out for the top level's databaseUrl"}
			}
			return nil
		})
		if err != nil {
			return err
		}
		p.cfg.Groups = append(p.cfg.Groups, g)
	}
	return nil
}

// handlers decodes a list of handlers found at key path.
func (p *parser) handlers(v *yaml.Node, key string) ([]Handler, *Error) {
	if isNull(v) {
		return nil, nil
	}
	if v.Kind != yaml.SequenceNode {
		return nil, &Error{Key: key, Line: p.lines[key], Msg: "must be a list of handlers, got " + describe(v)}
	}
	handlers := make([]Handler, 0, len(v.Content))
	for i, item := range v.Content {
		item = resolve(item)
		path := key + "[" + strconv.Itoa(i) + "]"
		p.lines[path] = item.Line
		if item.Kind != yaml.MappingNode {
			return nil, &Error{Key: path, Line: item.Line, Msg: "must be a mapping, got " + describe(item)}
		}
		var h Handler
		err := p.mapping(item, path+".", func(name string, k, v *yaml.Node) *Error {
			return p.handlerKey(&h, path, name, k, v)
		})
		if err != nil {
			return nil, err
		}
		handlers = append(handlers, h)
	}
	return handlers, nil
}

// mapping walks the key/value pairs of m in document order, rejecting
// non-scalar and duplicate keys, recording each key's line under prefix,
// and calling fn for every pair. It stops at the first error.
func (p *parser) mapping(m *yaml.Node, prefix string, fn func(name string, k, v *yaml.Node) *Error) *Error {
	seen := make(map[string]int, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], resolve(m.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			return &Error{Key: strings.TrimSuffix(prefix, "."), Line: k.Line, Msg: "keys must be plain strings, got " + describe(k)}
		}
		name := k.Value
		if first, dup := seen[name]; dup {
			return &Error{Key: prefix + name, Line: k.Line, Msg: fmt.Sprintf("duplicate key, first set on line %d", first)}
		}
		seen[name] = k.Line
		p.lines[prefix+name] = k.Line
		if err := fn(name, k, v); err != nil {
			return err
		}
	}
	return nil
}

// resolve follows aliases to the node they refer to.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

// describe names the kind of a node for error messages.
func describe(n *yaml.Node) string {
	switch {
	case isNull(n):
		return "no value"
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind == yaml.ScalarNode:
		return strconv.Quote(n.Value)
	default:
		return "an unsupported value"
	}
}

// decodeInt stores the integer held by v in dst, or returns why it cannot.
func decodeInt(v *yaml.Node, dst *int) string {
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" {
		return "must be an integer, got " + describe(v)
	}
	var n int
	if err := v.Decode(&n); err != nil {
		return "must be an integer that fits in 64 bits, got " + describe(v)
	}
	*dst = n
	return ""
}

// decodeString stores the scalar held by v in dst, or returns why it
// cannot. Any scalar is accepted as its literal text, so "groupId: 42"
// means "42"; an empty value means "".
func decodeString(v *yaml.Node, dst *string) string {
	if isNull(v) {
		*dst = ""
		return ""
	}
	if v.Kind != yaml.ScalarNode {
		return "must be a string, got " + describe(v)
	}
	*dst = v.Value
	return ""
}

func decodeBool(v *yaml.Node, dst *bool) string {
	if isNull(v) {
		*dst = false
		return ""
	}
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!bool" {
		return "must be true or false, got " + describe(v)
	}
	*dst = v.Value == "true" || v.Value == "True" || v.Value == "TRUE"
	return ""
}

func boolField(get func(c *Config) *bool) topField {
	return func(c *Config, v *yaml.Node) string { return decodeBool(v, get(c)) }
}
