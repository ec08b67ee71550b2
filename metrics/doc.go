// Package metrics exposes what a pgevents consumer does, and where its
// group stands in the log, as Prometheus metrics, and serves them with
// health and readiness endpoints.
//
// # Mechanism
//
// Two sources feed the metrics, on a registry of their own (never the
// global default registry, so that two consumers in one process, or a
// test, never collide):
//
//   - Events, pushed by the consumer. [Metrics] implements
//     pgevents.Observer: set it as Config.Observer and the consumer calls
//     it after each committed batch, failed batch, wake-up and listener
//     connect. It only increments counters and observes histograms (no I/O,
//     no lock held for long), so it never slows the consumer down. These
//     metrics describe this process: sum them over processes.
//   - State, pulled from the database at scrape time. When Options.DB is
//     set, a collector reads the group's state on the topic with one
//     statement ([ReadState]; the SQL and why it is cheap are beside it)
//     and exposes it. A reading is cached for Options.LagCacheTTL (1 s), and
//     concurrent scrapes share the reading in flight, so scrapes never
//     multiply statements; it is bounded by Options.LagTimeout (3 s). These
//     metrics describe the group, whatever process reports them: every
//     process of a group reports every partition of the topic (so that a
//     partition whose process died still shows its lag); take max() over
//     processes, not sum().
//
// [Server] serves /metrics, /healthz (200 while the process runs), /readyz
// (200 only when the database answers SELECT 1 within a second and the
// consumer's listener is connected; 503 with the failing checks otherwise)
// and, when enabled, Go's profiles under /debug/pprof/. NewServer listens at
// once, so that a bad or busy address fails before the consumer starts; Run
// serves until its context ends and then shuts down gracefully.
//
// # Labels
//
// group is the consumer group, topic the topic id, partition the partition
// number; class is a pgevents.Class name (transient, deployment, permanent,
// unknown); source a pgevents.WakeSource name (notify, poll, reconnect).
// Histograms carry group and topic only, to keep the number of series
// independent of the partition count.
//
// # Metrics from the consumer (this process)
//
//   - pgevents_events_handled_total{group,topic,partition}: events handled
//     and committed. Dead-lettered and parked events are not counted.
//   - pgevents_batch_size{group,topic}: histogram of events per committed
//     batch, handled, dead-lettered or parked, after extension to the end
//     of a producer transaction (so it can exceed batchSize).
//   - pgevents_handler_duration_seconds{group,topic}: histogram of the
//     time spent in handlers per committed batch.
//   - pgevents_batch_duration_seconds{group,topic}: histogram of a
//     committed batch's time from claim to commit.
//   - pgevents_end_to_end_latency_seconds{group,topic}: histogram of the
//     time from an event's append (created_at) to its handling, both on
//     the database clock. One observation per handled event, at most 1024
//     per batch (pgevents.MaxEndToEndSamples): its count can be lower than
//     the events handled. Buckets from 100 µs to 60 s.
//   - pgevents_retries_total{group,topic,partition,class}: batches rolled
//     back to be retried, by the class of their failure. A permanent
//     failure counts once here before its unit is dead-lettered.
//   - pgevents_dead_letters_total{group,topic,partition}: units (the
//     partition-local slice of one producer transaction) written to
//     dead_letter_queue.
//   - pgevents_parked_units_total{group,topic,partition}: units held back
//     in parked_events behind a dead letter of one of their hosts (policy
//     parkHost).
//   - pgevents_wakeups_total{group,topic,source}: workers woken, by what
//     woke them: tail (the elected watcher of the process saw the
//     partition's tail move: the usual source while events flow),
//     in_flight (it saw an append in flight there), notify (a
//     notification, from a producer after a quiet period or from another
//     process's watcher, or a sequencer's tick), poll (the safety net
//     found work), reconnect, tick (a tick of the sequencer this process
//     runs, heard on the sequencer's own session at its commit).
//     Wake-ups by poll while events flow mean lost notifications.
//   - pgevents_listener_reconnects_total{group,topic}: reconnects of the
//     listening connection (the first connect is not one);
//     pgevents_listener_connects_total counts every connect.
//   - pgevents_listener_connected{group,topic}: 1 while the listening
//     connection is up (see Metrics.SetListenerConnectedFunc).
//   - pgevents_partition_failing_batches{group,topic,partition}: batches
//     of the partition that failed since its last commit, and
//     pgevents_partition_failing_since_seconds{group,topic,partition}: when
//     the first of them failed (Unix time; 0 while batches commit). A
//     partition whose batches keep failing holds its events back: alert
//     on time() - since above a few minutes while batches > 0.
//   - pgevents_partitions_owned{group,topic}: partitions this process
//     serves and that are not halted (see Metrics.SetPartitionsOwnedFunc).
//     Summed over a group's processes, it should equal the partition count.
//   - pgevents_partitions_unserved{group,topic}: partitions this process
//     holds whose batches cannot get a database session; each is released
//     within pgevents.SessionFailureBound (see
//     Metrics.SetPartitionsUnservedFunc).
//   - go_* and process_*: the Go runtime and the process, unless
//     Options.NoRuntimeMetrics.
//
// # Metrics from the database (the group)
//
//   - pgevents_consumer_lag_events{group,topic,partition}: events at or
//     after the group's next_offset (for a sequenced topic, with the
//     events staged for the partition that its sequencer has not moved
//     into the log yet), counted up to a cap (Options.LagCap,
//     default [DefaultLagCap] = 100000, itself exposed as
//     pgevents_consumer_lag_events_cap): counting reads one index entry per
//     event, and the cap bounds a scrape's cost when a group is far behind.
//     pgevents_consumer_lag_events_capped is 1 when counting stopped at
//     the cap, so the lag is at least that.
//   - pgevents_consumer_lag_seconds{group,topic,partition}: the database
//     clock minus the created_at of the first event at or after
//     next_offset (or of the oldest staged one, when older); 0 when the
//     group is caught up. The age of the oldest unhandled event: the
//     metric to alert on.
//   - pgevents_consumer_next_offset and pgevents_log_end_offset
//     {group,topic,partition}: the group's position and the partition's
//     highest offset (absent while the partition is empty).
//   - pgevents_dead_letters_open{group,topic,partition}: rows of
//     dead_letter_queue, dead letters neither replayed nor discarded.
//   - pgevents_partition_halted{group,topic,partition}: 1 while
//     partition_halts has a row (the partition is stopped before a failing
//     unit and nothing after it is handled), else 0.
//   - pgevents_notification_queue_usage: pg_notification_queue_usage(),
//     the fraction of the server's notification queue in use. It grows
//     when a listening session stops reading (a frozen process), and
//     producers' commits fail when it is full.
//   - pgevents_topic_partitions{group,topic}: the topic's partition count
//     (log_counter.total_partitions), to compare with the sum of
//     pgevents_partitions_owned.
//   - pgevents_sequencer_staged_events{group,topic}: for a sequenced
//     topic, the events committed in its staging tables that no tick of
//     its sequencer has moved into the log yet, counted up to the lag cap;
//     pgevents_sequencer_last_tick_age_seconds{group,topic}, the time
//     since a tick last moved events. Both grow while no process
//     sequences the topic (none runs, or the one holding the sequencer key
//     is stuck): alert PgeventsSequencerStalled. Absent for other topics.
//   - pgevents_lag_query_up{group,topic}: 1 when the last reading
//     succeeded; 0 when it failed or timed out, and then the metrics above
//     are absent from the scrape. pgevents_lag_query_duration_seconds is the
//     reading's duration.
//
// Partitions where the group has no position (no process of the group has
// ever served them) have no lag series; pgevents_partitions_owned shows
// them as unserved.
//
// The Grafana dashboard and the Prometheus alert rules built on these
// metrics are in deploy/grafana and deploy/prometheus.
package metrics
