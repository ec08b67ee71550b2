package main

import (
	"context"
	"io"
)

func benchCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return usagef("bench: not implemented yet")
}
