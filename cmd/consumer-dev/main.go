// Command consumer-dev is the consumer command plus its development
// commands: demo (producers and a consumer group on a PostgreSQL it starts
// itself) and bench (the benchmark table of BENCHMARKS.md). They start
// throwaway PostgreSQL clusters and in-process Kafka brokers, so they are
// kept out of the production binary, which hands `consumer demo` and
// `consumer bench` to this one.
package main

import (
	"github.com/pgevents/pgevents/cmd/consumer-dev/internal/bench"
	"github.com/pgevents/pgevents/cmd/consumer-dev/internal/demo"
	"github.com/pgevents/pgevents/cmd/consumer/consumercli"
)

func main() {
	(&consumercli.CLI{Commands: []consumercli.Command{demo.Command, bench.Command}}).Execute()
}
