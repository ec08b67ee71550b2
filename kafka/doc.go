// Package kafka serves the Kafka wire protocol over a pgevents database:
// Kafka clients (franz-go, librdkafka and kcat, Sarama, Kafka Connect,
// ClickHouse's Kafka engine, ...) read and write pgevents topics without a
// Kafka cluster. `consumer kafka` runs it, and `consumer run` serves it
// beside its consumers when db-event-consumer.yml has a kafka section. It
// uses pgevents' public layers only, so the root package links no Kafka
// code; requests and responses are encoded by franz-go's kmsg.
//
// # Mapping
//
// A Kafka topic is a pgevents topic (Options.Topics names them); a Kafka
// partition is a pgevents partition and a Kafka offset its c_offset. Under
// offset scope topic a partition's offsets have gaps, which clients take
// as they take a compacted topic's. A record's key is the event's host_id,
// its value the payload's JSON, its timestamp created_at, and its headers
// event_type, event_id, user_id (when set), transaction_id and the
// metadata's entries (a string entry as its text, another as its JSON;
// trace context included). A partition's log start offset is the first
// offset retention has not removed from it (1 until retention drops one of
// its segments: migration 0018's partition_counters.log_start, which only
// retention moves, as only deletion moves a broker's), its high watermark
// the offset after the newest committed one.
//
// # Reading
//
// A Fetch reads each partition's committed events at and above the offset
// asked, in order, as record batches (magic 2, CRC-32C), concurrently for
// the partitions of a request. Offsets are gapless and commit-ordered per
// partition (or topic): a visible offset implies every lower one is
// committed, so a fetch never skips an event, and events of rolled-back
// transactions are never served. A fetch in a gap of a partition's offsets
// serves the next event (a fetch at the end of an empty partition waits for
// its first, whatever its offset); only an offset below the log start or
// above the high watermark answers OFFSET_OUT_OF_RANGE (clients then apply
// auto.offset.reset). A fetch with nothing to return waits, up to its
// MaxWaitMs (bounded by Options.MaxWait), for an append to one of its
// partitions: the endpoint follows pgevents' own wake-ups (it listens on
// the topic's channel and holds the topic's follow key, so the elected
// watcher of a running consumer announces what moved), and, while no
// consumer of the topic runs, it reads the tails of the partitions its
// fetches wait on itself, every millisecond while events flow and up to
// every 25 ms once they stop (see wait.go).
//
// # Consumer groups
//
// Groups speak the classic protocol (JoinGroup, SyncGroup, Heartbeat,
// LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups), with
// membership in the coordinator's memory. A Kafka group is the pgevents
// group of the same name: its first commit subscribes it (from the
// earliest retained event), and its committed offsets are the group's
// positions, so `consumer status`, the console, metrics and retention see
// it, and `consumer offsets reset` moves it. A commit takes each
// partition's position lock, as a worker's batch does. A partition the
// group never committed in is read from where the subscription placed it;
// while the group has members its subscription is kept live, and a minute
// after the last one left it is DEAD (it no longer holds retention back).
//
// A group's name belongs to one kind of consumer at a time. While a Kafka
// group has members (or a tool's commit from outside its membership is
// being taken), the coordinator session holds the group's name
// (offsets.HoldGroup): pgevents replicas of the group refuse to start, and
// one that was not live meanwhile commits nothing more and stops. The name
// is taken only while no replica of the group is live: otherwise a
// JoinGroup answers INCONSISTENT_GROUP_PROTOCOL and a commit from outside
// the membership UNKNOWN_MEMBER_ID, as Kafka answers for a group whose
// members speak another protocol. A commit from outside the membership
// (generation -1, a tool's reset) is an operator's action: it goes to the
// audit with origin kafka. A negative offset leaves the partition with no
// committed offset; 0 is taken as 1. Every refusal is the error a broker
// gives for the same case (docs/kafka.md has the table), retriable only
// when the condition passes, and is logged, once per interval per client
// and kind.
//
// Each group has one coordinator among the gateways that serve the
// database: the one whose coordinator session holds the group's key, an
// advisory lock for the session (migration 0017). The others answer
// FindCoordinator with its address, and group requests with
// NOT_COORDINATOR. When its session ends, the key goes with it, and the
// next gateway asked takes the group over; its members join again, as
// after a Kafka coordinator's failover. Commits run on the coordinator
// session itself, so a gateway that lost the key cannot commit.
//
// # Producing
//
// A Produce appends its records in one transaction, through the same path
// as pgevents.Append, and answers after COMMIT (acks 1 and all alike; acks
// 0 answers nothing). A record needs a key (its host_id) and a JSON value;
// the header event_type gives its type (default "kafka"), user_id its
// user, the other headers go into its metadata. A batch with a record
// that cannot be an event is refused whole with INVALID_RECORD, naming the
// record. The partition an event lands in is pgevents' (hashtext(host_id)
// % N), whatever partition the client chose: the answer carries the first
// event's offset when every record landed in the partition asked, else -1.
// Idempotent producers (franz-go's default) get a producer id from
// InitProducerId; each of their records is appended with an idempotency
// key of its producer id, the partition asked and its sequence number, so
// a batch sent again (its answer lost) appends nothing twice, within the
// topic's idempotency window. Transactions (transactional ids) are not
// served.
//
// # Limits
//
// A request frame is bounded by Options.MaxRequestBytes (and so is a
// batch once decompressed), its database work by Options.RequestTimeout;
// a malformed request closes its connection and nothing else; a
// connection idle for ten minutes is closed. SASL/PLAIN (Options.Users,
// refusing an authorization id other than the user's own, as Kafka does)
// and TLS (Options.TLS) protect the listener; Options.ReadOnly refuses
// Produce.
package kafka
