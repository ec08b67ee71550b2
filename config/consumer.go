package config

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents"
)

// Consumer returns the pgevents.Config of a group of the file (one of
// GroupConfigs, validated), with handlers and logger. It is the one place
// where the file's keys become a consumer's configuration.
func (c *Config) Consumer(handlers *pgevents.Handlers, logger *zerolog.Logger) pgevents.Config {
	var parts []int
	if c.PartitionID >= 0 {
		parts = []int{c.PartitionID}
	}
	var unknown pgevents.UnknownEventPolicy
	_ = unknown.UnmarshalText([]byte(c.UnknownEventType)) // validated
	var policy pgevents.FailurePolicy
	_ = policy.UnmarshalText([]byte(c.OnPermanentFailure)) // validated
	return pgevents.Config{
		GroupID:             c.GroupID,
		TopicID:             c.TopicID,
		TotalPartitions:     c.TotalPartitions,
		Partitions:          parts,
		LeaseDuration:       c.Lease(),
		BatchSize:           c.BatchSize,
		WaitPeriod:          c.WaitPeriod(),
		Channel:             c.Channel,
		UnknownEventType:    unknown,
		RetryInitial:        c.RetryInitial(),
		RetryMax:            c.RetryMax(),
		MaxAttempts:         c.MaxAttempts,
		OnPermanentFailure:  policy,
		MaxDeadLetters:      c.MaxDeadLetterRate,
		DeadLetterWindow:    c.DeadLetterWindow(),
		HandlerTimeout:      c.HandlerTimeout(),
		ShutdownTimeout:     c.ShutdownTimeout(),
		Handlers:            handlers,
		Logger:              logger,
		StartFrom:           c.StartFrom,
		DeadAfter:           c.DeadAfter(),
		MaintenanceInterval: c.MaintenanceInterval(),
		Schema:              c.Schema,
	}
}

// PoolOptions returns the session timeouts of the file's consumer pool:
// statementTimeoutMs and idleInTransactionTimeoutMs, where 0 leaves the
// server's setting.
func (c *Config) PoolOptions() pgevents.PoolOptions {
	timeout := func(ms int) time.Duration {
		if ms == 0 {
			return pgevents.ServerSetting
		}
		return millis(ms)
	}
	return pgevents.PoolOptions{
		StatementTimeout:         timeout(c.StatementTimeoutMs),
		IdleInTransactionTimeout: timeout(c.IdleInTransactionTimeoutMs),
	}
}

// PoolSize returns the connections the file's consumers need in the pool
// they share: maxConns when set, otherwise pgevents.PoolSize of the
// partitions each group serves, summed over the groups.
func (c *Config) PoolSize() int {
	if c.MaxConns > 0 {
		return c.MaxConns
	}
	n := 0
	for _, g := range c.GroupConfigs() {
		if g.PartitionID >= 0 {
			n += pgevents.PoolSize(1)
		} else {
			n += pgevents.PoolSize(g.TotalPartitions)
		}
	}
	return n
}
