package pgevents

import "time"

// Observer receives what a consumer does, for metrics. Its methods are
// called from the consumer's goroutines, concurrently, and must be fast and
// never block. Set it in Config.Observer; the metrics package implements it
// with Prometheus.
type Observer interface {
	// BatchCommitted is called after each committed batch.
	BatchCommitted(b BatchStats)
	// BatchFailed is called after each batch that was rolled back, with the
	// class of its failure.
	BatchFailed(partition int, class Class)
	// Woken is called when a worker is woken, with the source of the
	// wake-up.
	Woken(partition int, source WakeSource)
	// ListenerConnected is called after each connect of the listener; the
	// first connect has reconnect false.
	ListenerConnected(reconnect bool)
	// Skipped is called when the consumer learns that retention removed n
	// events of partition before the group handled them, and why
	// ("retention": the group was DEAD; "max_retention": the hard cap).
	Skipped(partition int, n int64, reason string)
}

// WakeSource says what woke a partition worker.
type WakeSource int

const (
	// WakeNotify is a notification naming the partition.
	WakeNotify WakeSource = iota
	// WakePoll is the periodic poll (every WaitPeriod) finding work.
	WakePoll
	// WakeReconnect is the poll run after the listener (re)connected.
	WakeReconnect
	// WakeTail is the watcher finding a new event in the partition's tail,
	// while events flow (no notification is sent then).
	WakeTail
	// WakeInFlight is the watcher finding an append in flight in the
	// partition, whose worker had nothing to do: the worker's claim waits
	// for that append's commit.
	WakeInFlight
	// WakeTick is the announcement of a tick of the sequencer this
	// consumer runs (a sequenced topic), heard on the sequencer's own
	// session at the tick's commit, before the listener's copy of it.
	WakeTick
)

// String returns the source's metric label.
func (s WakeSource) String() string {
	switch s {
	case WakePoll:
		return "poll"
	case WakeReconnect:
		return "reconnect"
	case WakeTail:
		return "tail"
	case WakeInFlight:
		return "in_flight"
	case WakeTick:
		return "tick"
	}
	return "notify"
}

// BatchStats describes one committed batch.
type BatchStats struct {
	// Group, Topic and Partition say whose batch it was.
	Group     string
	Topic     int
	Partition int
	// FirstOffset and LastOffset are the batch's range in the partition.
	FirstOffset, LastOffset int64
	// Events is the number of events in the batch: handled, dead-lettered
	// or parked.
	Events int
	// Handled, DeadLettered and ParkedUnits count what happened to them.
	Handled      int
	DeadLettered int
	ParkedUnits  int
	// HandlerDuration is the time spent in handlers.
	HandlerDuration time.Duration
	// Duration is the batch's time from claim to commit.
	Duration time.Duration
	// EndToEnd holds, for up to MaxEndToEndSamples handled events, the time
	// from the event's append to its handling, both on the database clock
	// (the consumer estimates the offset between its clock and the
	// database's at every poll).
	EndToEnd []time.Duration
}

// MaxEndToEndSamples bounds BatchStats.EndToEnd.
const MaxEndToEndSamples = 1024

// nopObserver is the Observer of a consumer that has none.
type nopObserver struct{}

func (nopObserver) BatchCommitted(BatchStats)        {}
func (nopObserver) BatchFailed(int, Class)           {}
func (nopObserver) Woken(int, WakeSource)            {}
func (nopObserver) ListenerConnected(reconnect bool) {}
func (nopObserver) Skipped(int, int64, string)       {}
