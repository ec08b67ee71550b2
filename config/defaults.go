package config

import (
	"time"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/kafka"
	"github.com/pgevents/pgevents/schema"
)

// Defaults of the keys that only the file has: pgevents.Config's are the
// pgevents.Default constants, and the topic's are schema's.
const (
	// DefaultTotalPartitions is totalPartitions when the file leaves it
	// out (pgevents.Config requires it): schema.DefaultPartitions.
	DefaultTotalPartitions = schema.DefaultPartitions
	// DefaultRetention is how long a topic keeps what every group handled.
	DefaultRetention = "7d"
	// DefaultZeroSubscriptionRetention is how long a topic without
	// subscriptions keeps its events.
	DefaultZeroSubscriptionRetention = "24h"
	// DefaultIdempotencyWindow is how long a topic's idempotency keys
	// count: schema.DefaultIdempotencyWindow, in the file's spelling.
	DefaultIdempotencyWindow = "24h"
	// DefaultTracingServiceName is tracing.serviceName when the file and
	// OTEL_SERVICE_NAME leave it out.
	DefaultTracingServiceName = "pgevents-consumer"
	// DefaultTracingSampleRatio is tracing.sampleRatio when the file
	// leaves it out: every batch is traced.
	DefaultTracingSampleRatio = 1.0

	// DefaultKafkaListen is kafka.listen's default: the kafka package's.
	DefaultKafkaListen = kafka.DefaultListen
	// DefaultKafkaMaxRequestBytes is kafka.maxRequestBytes' default.
	DefaultKafkaMaxRequestBytes = kafka.DefaultMaxRequestBytes
	// DefaultKafkaMaxWaitMs is kafka.maxWaitMs' default.
	DefaultKafkaMaxWaitMs = int(kafka.DefaultMaxWait / time.Millisecond)
	// DefaultKafkaRequestTimeoutMs is kafka.requestTimeoutMs' default.
	DefaultKafkaRequestTimeoutMs = int(kafka.DefaultRequestTimeout / time.Millisecond)
)

// Default returns a Config holding every default. DatabaseURL and GroupID,
// which have no default, are empty, so the result does not pass
// [Config.Validate] until they are set. The defaults shared with
// pgevents.Config are its constants, in the file's units.
func Default() Config {
	return Config{
		TopicID:           pgevents.DefaultTopic,
		BatchSize:         pgevents.DefaultBatchSize,
		TotalPartitions:   DefaultTotalPartitions,
		PartitionID:       -1,
		WaitPeriodMs:      ms(pgevents.DefaultWaitPeriod),
		LogLevel:          "info",
		LogFormat:         "auto",
		UnknownEventType:  pgevents.UnknownEventFail.String(),
		MaxConns:          0,
		ShutdownTimeoutMs: ms(pgevents.DefaultShutdownTimeout),
		RetryInitialMs:    ms(pgevents.DefaultRetryInitial),
		RetryMaxMs:        ms(pgevents.DefaultRetryMax),
		MaxAttempts:       pgevents.DefaultMaxAttempts,

		OnPermanentFailure:         pgevents.PolicyDeadLetter.String(),
		MaxDeadLetterRate:          pgevents.DefaultMaxDeadLetters,
		DeadLetterWindowMs:         ms(pgevents.DefaultDeadLetterWindow),
		HandlerTimeoutMs:           ms(pgevents.DefaultHandlerTimeout),
		StatementTimeoutMs:         ms(pgevents.DefaultStatementTimeout),
		IdleInTransactionTimeoutMs: ms(pgevents.DefaultIdleInTransactionTimeout),
		LeaseMs:                    ms(pgevents.DefaultLeaseDuration),
		StartFrom:                  pgevents.DefaultStartFrom,
		DeadAfterMs:                ms(pgevents.DefaultDeadAfter),
		MaintenanceIntervalMs:      ms(pgevents.DefaultMaintenanceInterval),
		Retention:                  DefaultRetention,
		ZeroSubscriptionRetention:  DefaultZeroSubscriptionRetention,
		IdempotencyWindow:          DefaultIdempotencyWindow,
		SegmentSize:                schema.DefaultSegmentSize,
		OffsetAllocation:           schema.AllocationCounter,
		OffsetScope:                schema.ScopeTopic,
	}
}

// ms returns d in whole milliseconds, the file's unit.
func ms(d time.Duration) int { return int(d / time.Millisecond) }
