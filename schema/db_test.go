package schema_test

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/schema"
)

// The handles schema.DB documents.
var (
	_ schema.DB = (*pgxpool.Pool)(nil)
	_ schema.DB = (*pgxpool.Conn)(nil)
	_ schema.DB = (*pgx.Conn)(nil)
	_ schema.DB = pgx.Tx(nil)
)
