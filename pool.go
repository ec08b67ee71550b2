package pgevents

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/listener"
)

// ParsePoolConfig parses a connection URL into a pool configuration suited
// to a consumer: TCP keepalive and TCP_USER_TIMEOUT on every connection (so
// that the server and the client notice a dead peer in seconds, and a batch
// stuck on a vanished server fails instead of hanging), and application_name
// "pgevents-consumer" unless the URL sets one. Adjust MaxConns before
// creating the pool: a consumer needs one connection per served partition
// plus two.
func ParsePoolConfig(url string) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("pgevents: parse database url: %w", err)
	}
	pc.ConnConfig.DialFunc = listener.Dial
	if pc.ConnConfig.RuntimeParams["application_name"] == "" {
		pc.ConnConfig.RuntimeParams["application_name"] = "pgevents-consumer"
	}
	return pc, nil
}
