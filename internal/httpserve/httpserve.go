// Package httpserve runs an HTTP server for as long as a context lives,
// the one start/stop contract of the servers pgevents serves (the console,
// the metrics endpoint): Run serves on a listener the caller opened (so an
// address in use fails before anything else starts), and when the context
// ends it shuts the server down gracefully.
//
// Shutdown stops accepting, then waits up to a bound for the requests in
// flight; connections still open after it are closed. Both goroutines
// belong to one errgroup that Run waits for, so no goroutine outlives Run.
package httpserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"
)

// Run serves srv on ln until ctx ends, then shuts srv down: it stops
// accepting, waits up to shutdownTimeout for the requests in flight,
// closes what remains and returns nil. It returns Serve's error, unwrapped,
// when serving fails for another reason; callers add their package's
// prefix. Call it once per server.
func Run(ctx context.Context, srv *http.Server, ln net.Listener, shutdownTimeout time.Duration) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
		return nil
	})
	return g.Wait()
}
