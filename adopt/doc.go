// Package adopt moves a deployment of the seed design onto pgevents without
// losing its place.
//
// Such a deployment has its own tables: log_counter(id, next_offset) with
// one row, an outbox_message_t whose rows carry a c_offset taken from that
// counter (uuid ids, hosts, users and transactions, a jsonb payload), and
// consumer_offsets(group_id, topic_id, partition_id, next_offset), the next
// offset each group reads in each partition, where a partition is
// abs(hashtext(host_id::text)) % N. pgevents keeps the same numbering: an
// offset is a position in one sequence across the topic (offset scope
// 'topic'), and a group's position in a partition is the next offset it
// reads there. Adopt therefore copies the log and the positions as they
// are, into a topic of pgevents (in a schema of its own, beside the old
// tables):
//
//   - the events that have an offset keep it, and their id as event_id; a
//     uuid host or user becomes its text, so every host keeps its
//     partition (pgevents computes abs(hashtext(host_id)::bigint) % N, the
//     seed's value for every host); the uuid transaction_id, and every
//     column pgevents has no place for, go into metadata under their own
//     names, never dropped;
//   - the segments those offsets need are created before the copy, so no
//     event lands in a DEFAULT partition (checked);
//   - the topic's counter continues from the old log_counter.next_offset,
//     and consumer_offsets is copied one to one: each group resumes exactly
//     where it stood, nothing replayed, nothing skipped.
//
// All of it runs in one transaction that first takes the old counter's row
// lock (waiting for the producers in flight and holding new ones off) and
// locks the old outbox and consumer_offsets against writes, and then checks
// what it copies: it refuses, naming the problem, when offsets are missing
// that some group has not handled, when an offset or a position lies beyond
// the counter, when a position names a partition the count does not have,
// when an event has no host or type, or when the topic is not new (a
// second run finds its own adoption recorded in adoptions). Interrupted,
// it leaves nothing behind and can simply run again.
//
// The partition count must be the one the old consumers used. It is read
// from consumer_offsets when every group has a position in exactly the
// partitions 0..N-1; otherwise Options.Partitions must give it.
//
// With Options.Bridge, adopt also installs a trigger on the old outbox
// table that appends every row inserted from then on, in the inserting
// transaction, to pgevents' log (same event_id, offsets in the old order),
// for producers that cannot move to append_event on the day: the old
// consumers and pgevents' consumers run side by side until the producers have moved
// and Unbridge removes it. Every event is then written twice.
//
// Inspect reads the tables without locking or writing anything (a dry run);
// Plan.Script returns the SQL of the adoption for a team's own migration
// tool; Adopt runs it.
package adopt
