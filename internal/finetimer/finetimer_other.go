//go:build !linux

package finetimer

import "time"

// impl has no precise clock: Sleep uses time.Sleep.
type impl struct{}

func newImpl() impl { return impl{} }

func (impl) sleep(time.Duration) bool { return false }

func (impl) close() {}
