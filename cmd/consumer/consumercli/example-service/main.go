// Command example-service is a service's own consumer binary: an orders
// service registers its two Go handlers by name and gets every command of
// the stock consumer (run, migrate, status, dlq, offsets, group, ...), its
// metrics and health endpoints and its graceful shutdown, configured by the
// same db-event-consumer.yml, whose handlers of type go name them:
//
//	groupId: billing
//	totalPartitions: 8
//	metricsAddr: ":9464"
//	handlers:
//	  - eventType: order.placed
//	    type: go
//	    name: invoices
//	  - eventType: order.shipped
//	    type: go
//	    name: shipments
//
// Run it as the stock binary: example-service migrate, then
// example-service run. The handlers write the service's own table,
//
//	CREATE TABLE invoices (
//		order_id  bigint PRIMARY KEY,
//		customer  text   NOT NULL,
//		amount    bigint NOT NULL,
//		placed_at bigint NOT NULL, -- the offset of order.placed
//		shipped_at bigint,         -- the offset of order.shipped
//		shipments int    NOT NULL DEFAULT 0
//	);
//
// in the consumer's transaction, so each event's effect commits with the
// group's position: exactly once. Orders are appended with the customer as
// the host, so each customer's events are handled in order: an order is
// always placed before it ships.
package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/cmd/consumer/consumercli"
)

func main() {
	(&consumercli.CLI{Handlers: consumercli.Handlers{
		"invoices":  pgevents.JSONHandler(invoice),
		"shipments": pgevents.JSONHandler(ship),
	}}).Execute()
}

// order is the payload of the order events.
type order struct {
	ID     int64 `json:"order_id"`
	Amount int64 `json:"amount"`
}

// invoice records the invoice of an order placed.
func invoice(ctx context.Context, tx pgx.Tx, ev *pgevents.Event, o order) error {
	_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id, customer, amount, placed_at) VALUES ($1, $2, $3, $4)`,
		o.ID, ev.HostID, o.Amount, ev.Offset)
	return err // a second invoice for the order is a unique violation: dead-lettered, never silent
}

// ship marks an order's invoice shipped. An order shipped before it was
// placed cannot happen (a customer's events are handled in order): it is
// a permanent failure.
func ship(ctx context.Context, tx pgx.Tx, ev *pgevents.Event, o order) error {
	tag, err := tx.Exec(ctx, `UPDATE invoices SET shipped_at = $2, shipments = shipments + 1 WHERE order_id = $1`, o.ID, ev.Offset)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return pgevents.Permanent(fmt.Errorf("order %d shipped before it was placed", o.ID))
	}
	return nil
}
