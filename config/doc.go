// Package config loads and validates db-event-consumer.yml, the file that
// configures a pgevents consumer process.
//
// # Loading
//
// [Load] reads a file and hands its content to [Parse]; [Parse] does the
// real work in four steps, always in this order:
//
//  1. The YAML is decoded and checked for shape: the top level must be a
//     mapping, every key must be known, no key may appear twice, and every
//     value must have the right type (an integer for the *Ms, *Size and
//     *Id keys, a string for the others, a list of mappings for handlers;
//     in a handler, a list of strings for brokers, mappings for tls, sasl
//     and headers, integers for deliveryTimeoutMs, maxRecordBytes,
//     timeoutMs and concurrency; a mapping of addr, token and readOnly for
//     console; a mapping of endpoint, serviceName, sampleRatio (a number)
//     and headers for tracing; a mapping for kafka whose topics map names
//     to integers, users names to passwords, and tls holds certFile and
//     keyFile).
//  2. Every key the file leaves out takes its default (see [Default] and
//     the documentation of each [Config] field). A key that is present
//     keeps its value even when that value is the zero value, so
//     "batchSize: 0" is reported as an error rather than silently replaced
//     by the default.
//  3. The environment override is applied (see below).
//  4. The result is validated by the same rules as [Config.Validate].
//
// The rules of a value live once, where its option is defined: the keys of
// a consumer group are mapped to a pgevents.Config ([Config.Consumer]) and
// checked by pgevents.Config.Validate, the keys of a relay are mapped to
// its Options ([Handler.KafkaOptions], [Handler.WebhookOptions]) and
// checked by their Validate, identifiers by schema.ValidIdentifier. Their
// errors are reported here under the file's keys. This package checks
// only what the file alone has: its own keys (databaseUrl, logging, the
// pool, retention, the metrics server), groups, handler types, and its
// encoding of the others: durations in milliseconds, partitionId -1 for
// every partition, and no 0 for a value whose zero means the default in
// Go (leave the key out for the default).
//
// Keys use camelCase, exactly as spelled in the yaml tags documented on
// [Config] and [Handler]; docs/reference.md#configuration lists every key
// with its type, default and environment override. A typical file:
//
//	databaseUrl: postgres://pgevents@localhost:5432/app
//	groupId: billing
//	batchSize: 100
//	totalPartitions: 8
//	partitionId: -1
//	waitPeriodMs: 10000
//	handlers:
//	  - eventType: "*"
//	    type: log
//	  - eventType: invoice_paid
//	    type: sql
//	    statement: INSERT INTO paid_invoices (id) VALUES ((@payload::jsonb->>'id')::bigint)
//
// # Environment override
//
// When the DATABASE_URL environment variable is set and non-empty it
// replaces databaseUrl from the file, so credentials can stay out of the
// file. A database URL is required from one source or the other. A groups
// item may set a databaseUrl of its own (one process serving groups on
// several databases: see [Config.Databases]), which DATABASE_URL does not
// replace; the groups that set none take the top level's. In the
// relays' handlers, sasl.password and headers values may name environment
// variables as ${NAME}; each must be set. PGEVENTS_CONSOLE_TOKEN, when set
// and non-empty, replaces console.token (of a file with a console
// section), which may also name environment variables as ${NAME}; the
// token is checked only where the console is served ([Config.ConsoleError]),
// so a command that never serves it needs neither the token nor its
// variables. Likewise the passwords of kafka.users may name environment
// variables, and they and the files of kafka.tls are checked only where
// the Kafka endpoint is served ([Config.KafkaError]). The tracing section's headers may name environment variables too, and the
// OpenTelemetry exporter's own variables (OTEL_EXPORTER_OTLP_*,
// OTEL_SERVICE_NAME) apply to what it leaves out.
//
// # Errors
//
// Every problem is reported as an [*Error] naming the offending key with its
// YAML spelling ("batchSize", "handlers[2].statement"; handler indexes start
// at 0) and, when known, the line on which it appears. Use [errors.As] to
// inspect it. Only the first problem is reported, and the choice is
// deterministic: problems of shape (step 1) come first, in document order;
// then problems of value (step 4), in document order, followed by required
// keys that are missing altogether.
//
// A *Config returned by [Load] or [Parse] has passed validation, so callers
// can use its values without checking them again. A Config built in Go
// should start from [Default] and be checked with [Config.Validate].
package config
