package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/console"
)

// serveConsole serves the operator console on addr in g until ctx ends,
// with a token made for this run (printed with the address: there is no
// default token), and c's handlers to replay the demo group's dead
// letters.
func serveConsole(ctx context.Context, g *errgroup.Group, pool *pgxpool.Pool, c *pgevents.Consumer, addr string,
	log *zerolog.Logger, stdout io.Writer) error {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	con, err := console.New(pool, console.Options{
		Token:  token,
		Logger: log,
		Resolvers: func(group string, topic int) console.Resolver {
			if group == "demo" && topic == 1 {
				return c
			}
			return nil
		},
	})
	if err != nil {
		return err
	}
	srv, err := console.Listen(addr, con)
	if err != nil {
		return fmt.Errorf("demo: --console %s: %w", addr, err)
	}
	fmt.Fprintf(stdout, "console: %s (sign in with token %s to act; it serves while the demo runs: --duration 10m to look longer)\n",
		srv.URL(), token)
	g.Go(func() error { return srv.Run(ctx) })
	return nil
}
