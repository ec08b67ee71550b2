// Command consumer runs pgevents consumer groups and administers the log:
// see package consumercli for its commands, or run `consumer -h`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgevents/pgevents/cmd/consumer/consumercli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := consumercli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, consumercli.Delegate("demo"), consumercli.Delegate("bench"))
	stop()
	os.Exit(code)
}
