// Package pgeventstest helps test code built on pgevents, handlers above
// all, against a real PostgreSQL: one call runs a consumer for the length
// of a test, on the connection settings a consumer has in production
// (pgevents.NewPoolConfig, pgevents.PoolSize), and stops it, waiting for
// its in-flight batch, when the test ends.
//
//	c, _ := pgeventstest.StartConsumer(t, databaseURL, pgevents.Config{
//		GroupID: "search", TotalPartitions: 8, Handlers: handlers,
//	})
//
// Append events in the test and poll the handlers' effects until a
// deadline: a consumer handles what is appended within milliseconds.
package pgeventstest

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents"
)

// StopTimeout bounds how long stopping a consumer may take before the test
// fails.
const StopTimeout = 30 * time.Second

// StartConsumer runs a consumer of cfg on the database url names, on a pool
// of its own with the production settings, until the test ends or stop is
// called, and returns once the consumer listens for notifications (Ready).
// A Logger left nil logs warnings and errors to stderr, with the test's
// name. The test fails if the consumer cannot start, if Run returns an
// error, or if it does not stop within StopTimeout.
func StartConsumer(tb testing.TB, url string, cfg pgevents.Config) (c *pgevents.Consumer, stop func()) {
	tb.Helper()
	if cfg.Logger == nil {
		l := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, NoColor: true}).Level(zerolog.WarnLevel).
			With().Timestamp().Str("test", tb.Name()).Logger()
		cfg.Logger = &l
	}
	pc, err := pgevents.ParsePoolConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	pc.MaxConns = int32(pgevents.PoolSize(cfg.TotalPartitions))
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		tb.Fatal(err)
	}
	c, err = pgevents.NewConsumer(pool, cfg)
	if err != nil {
		pool.Close()
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("pgeventstest: consumer %s: %v", cfg.GroupID, err)
				}
			case <-time.After(StopTimeout):
				tb.Errorf("pgeventstest: consumer %s did not stop within %s", cfg.GroupID, StopTimeout)
			}
			pool.Close()
		})
	}
	tb.Cleanup(stop)
	deadline := time.Now().Add(10 * time.Second)
	for !c.Ready() {
		select {
		case err := <-done:
			done <- err // for stop
			tb.Fatalf("pgeventstest: consumer %s stopped before it was ready: %v", cfg.GroupID, err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tb.Fatalf("pgeventstest: consumer %s not ready within 10 s", cfg.GroupID)
		}
	}
	return c, stop
}
