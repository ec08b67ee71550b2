// Package listener turns PostgreSQL notifications into wake-ups for partition
// workers.
//
// # Mechanism
//
// One dedicated connection per process runs LISTEN on the event channel
// through pgxlisten. An append notifies only the partitions a consumer
// sleeps on (the topic's wake-up mode `waiting`, the default; mode `always`
// notifies every append): at commit, one notification per append call and
// topic whose payload names those partitions and the highest offset written
// in each ("3:0/1041,5/1040"). While events flow, consumers read the tails
// themselves and producers send almost nothing (the root package's doc has
// the protocol). The listener decodes a payload and calls the Sink once per
// partition, so only the workers that may have work look, and a worker
// whose position is already past the offset stays asleep.
//
// # Notifications are hints
//
// A notification is lost when the connection drops, and a half-open TCP
// connection may deliver nothing for minutes before the kernel notices.
// Hence:
//
//   - The connection is dialled with TCP keepalive (idle 5 s, interval 1 s,
//     3 probes) and TCP_USER_TIMEOUT, so a dead peer is noticed in seconds.
//   - pgxlisten does not ping. A canary notification is sent on a channel of
//     this listener's own every CanaryInterval through another connection; if
//     none has come back for CanaryTimeout while sends succeed, the listening
//     connection is closed and dialled again.
//   - Reconnection follows a lost connection within 25–50 ms (jittered, so
//     that the replicas of a restarted server do not all dial at once) and
//     backs off, up to 5 s, while dialling fails (pgxlisten's
//     ReconnectDelay is a fixed minute by default; it is disabled here in
//     favour of that backoff). A repeated failure is logged once per 10 s,
//     with the count of repeats, and the reconnect that ends it once.
//   - After every (re)connect, once LISTEN is in place, the Sink's Connected
//     method is called, so that workers look for events committed while
//     nobody listened.
//   - Workers still poll on their own schedule: a wake-up is an optimisation,
//     never the only way to find work.
//
// A notification is also untrusted: anyone who can connect may notify the
// channel, with any payload, and another installation in the same database
// may share it. The Sink takes a payload as "look at these partitions",
// never as "these offsets exist": a worker claims on it and believes only
// what the claim finds. SetChannel moves a running listener to another
// channel, when the topic's channel changes.
package listener
