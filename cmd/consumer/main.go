// Command consumer runs pgevents consumer groups and administers the log:
// see package internal/cli for its commands, or run `consumer -h`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgevents/pgevents/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, cli.Delegate("demo"), cli.Delegate("bench"))
	stop()
	os.Exit(code)
}
