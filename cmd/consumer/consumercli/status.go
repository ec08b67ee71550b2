package consumercli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/internal/human"
	"github.com/pgevents/pgevents/metrics"
	"github.com/pgevents/pgevents/offsets"
	"github.com/pgevents/pgevents/schema"
)

// statusAbout is what `consumer status -h` prints before the flags.
const statusAbout = `Shows, for each topic of the configured groups, every consumer group that
has a position on it (or only --group G) × every partition: the group's next offset, the log end
(highest offset in the partition), the lag in events (counted up to a cap,
shown as ">=N" when reached) and in seconds (age of the first unhandled
event, on the database clock), open dead letters, and whether the
partition is halted (at which offset, and why). "-" means none, or no
position (no process of the group has served the partition yet).

--watch redraws the table every --interval (default 2s) until interrupted;
with --json it prints one JSON document per line instead.

The groups of the file are each shown from their own database and schema
(groups[i].databaseUrl, groups[i].schema, else the top level's), one table
per database, schema and topic; --group shows that group's.

--json prints one object per database, schema and topic (one for a file
whose groups share them), one after the other; its field names are stable:

  database                  user@host:port/database read (no password)
  schema                    the schema pgevents lives in; "" for the
                            first of the search_path
  topic_id                  the topic
  total_partitions          its partition count
  database_time             the database clock when read (RFC 3339)
  notification_queue_usage  pg_notification_queue_usage(), 0 to 1
  lag_cap                   the cap on lag_events
  watcher                   null when no consumer of the topic runs, or
                            {"session", "waiting"}: the application_name
                            of the elected watcher's session (it watches
                            every partition for every consumer of the
                            database) and how many consumers' watchers
                            wait to take over
  sequencer                 null unless the topic is sequenced, or
                            {"session", "waiting", "last_tick",
                            "last_tick_seconds", "staged_events",
                            "staged_capped", "staged_seconds"}: the
                            application_name of the session that holds
                            the sequencer key ("" when no process
                            sequences), the sessions waiting for it, when
                            a tick last moved events into the log and how
                            long ago, the events committed in staging that
                            no tick moved yet (up to lag_cap) and the age
                            of the oldest of them
  partitions                one object per group and partition, by group
                            then partition:
    group_id, partition_id
    next_offset             the group's position; null without one
    log_end                 the highest offset in the partition; null when empty
    lag_events              events at or after next_offset, up to lag_cap
                            (with, for a sequenced topic, the events
                            staged for the partition and not sequenced)
    lag_capped              true when counting stopped at lag_cap
    lag_seconds             database clock minus created_at of the first
                            unhandled event (staged or in the log); 0
                            when none
    dead_letters_open       rows of dead_letter_queue
    halted                  null, or {"offset", "reason", "since"}
    lease                   null when no replica holds a live lease, or
                            {"owner", "epoch", "heartbeat"}
    subscription            the group's state: ACTIVE, PAUSED, DEAD or
                            CANCELLED; null without a subscription
    skipped                 events retention removed before the group
                            handled them
    failing                 null while the partition's batches commit, or
                            the owner's report of those that failed since
                            its last commit: {"failures", "since",
                            "class", "failed_in" (handler, batch or
                            session), "error"}
`

// statusPoolSize is the pool of consumer status on each database: it
// reads one statement at a time.
const statusPoolSize = 2

// statusJSON is the document of consumer status --json. Its field names are
// a contract with scripts: add fields, never rename or remove one.
type statusJSON struct {
	// Database and Schema say where the document was read (the database
	// as user@host:port/name, never its password; the schema pgevents
	// lives in, "" for the first of the search_path).
	Database               string            `json:"database"`
	Schema                 string            `json:"schema"`
	TopicID                int               `json:"topic_id"`
	TotalPartitions        int               `json:"total_partitions"`
	DatabaseTime           time.Time         `json:"database_time"`
	NotificationQueueUsage float64           `json:"notification_queue_usage"`
	LagCap                 int64             `json:"lag_cap"`
	Watcher                *watcherStatus    `json:"watcher"`
	Sequencer              *sequencerStatus  `json:"sequencer"`
	Partitions             []partitionStatus `json:"partitions"`
}

// sequencerStatus is the sequencer of a sequenced topic (metrics.Sequencer).
type sequencerStatus struct {
	// Session is the application_name of the session that holds the
	// sequencer key; empty when no process sequences the topic.
	Session         string    `json:"session"`
	Waiting         int       `json:"waiting"`
	LastTick        time.Time `json:"last_tick"`
	LastTickSeconds float64   `json:"last_tick_seconds"`
	StagedEvents    int64     `json:"staged_events"`
	StagedCapped    bool      `json:"staged_capped"`
	StagedSeconds   float64   `json:"staged_seconds"`
}

// watcherStatus says which consumer's watcher the topic's consumers follow.
type watcherStatus struct {
	// Session is the application_name of the elected watcher's session,
	// "pgevents watcher <replica>".
	Session string `json:"session"`
	// Waiting counts the other consumers' watchers, waiting for its key.
	Waiting int `json:"waiting"`
}

// partitionStatus is one group's state in one partition.
type partitionStatus struct {
	GroupID         string      `json:"group_id"`
	PartitionID     int         `json:"partition_id"`
	NextOffset      *int64      `json:"next_offset"`
	LogEnd          *int64      `json:"log_end"`
	LagEvents       int64       `json:"lag_events"`
	LagCapped       bool        `json:"lag_capped"`
	LagSeconds      float64     `json:"lag_seconds"`
	DeadLettersOpen int64       `json:"dead_letters_open"`
	Halted          *haltStatus `json:"halted"`
	// Lease is the live lease of the partition's owner; Subscription the
	// group's subscription state.
	Lease        *leaseStatus `json:"lease"`
	Subscription *string      `json:"subscription"`
	// Skipped counts events retention removed before the group handled
	// them.
	Skipped int64 `json:"skipped"`
	// Failing is the owner's report that the partition's batches keep
	// failing; null while they commit.
	Failing *failingStatus `json:"failing"`
}

// failingStatus is a partition owner's report of its failed batches
// since its last commit (metrics.Failing).
type failingStatus struct {
	Failures int       `json:"failures"`
	Since    time.Time `json:"since"`
	Class    string    `json:"class"`
	FailedIn string    `json:"failed_in"`
	Error    string    `json:"error"`
}

// haltStatus says where and why a partition is halted.
type haltStatus struct {
	Offset int64     `json:"offset"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

// leaseStatus is the live lease of the replica that owns a partition.
type leaseStatus struct {
	Owner     string    `json:"owner"`
	Epoch     int64     `json:"epoch"`
	Heartbeat time.Time `json:"heartbeat"`
}

// statusFrom converts a reading of the database into the status document.
func statusFrom(st metrics.State) statusJSON {
	out := statusJSON{
		TopicID:                st.Topic,
		TotalPartitions:        st.TotalPartitions,
		DatabaseTime:           st.DatabaseTime,
		NotificationQueueUsage: st.NotificationQueueUsage,
		LagCap:                 st.LagCap,
		Partitions:             make([]partitionStatus, 0, len(st.Partitions)),
	}
	if sq := st.Sequencer; sq != nil {
		out.Sequencer = &sequencerStatus{Session: sq.Session, Waiting: sq.Waiting, LastTick: sq.LastTick,
			LastTickSeconds: sq.LastTickSeconds, StagedEvents: sq.Staged, StagedCapped: sq.StagedCapped, StagedSeconds: sq.StagedSeconds}
	}
	for _, p := range st.Partitions {
		ps := partitionStatus{
			GroupID: p.Group, PartitionID: p.Partition, NextOffset: p.NextOffset, LogEnd: p.LogEnd,
			LagEvents: p.LagEvents, LagCapped: p.LagCapped, LagSeconds: p.LagSeconds, DeadLettersOpen: p.DeadLettersOpen,
		}
		if p.Halt != nil {
			ps.Halted = &haltStatus{Offset: p.Halt.Offset, Reason: p.Halt.Reason, Since: p.Halt.Since}
		}
		if p.Lease != nil {
			ps.Lease = &leaseStatus{Owner: p.Lease.Owner, Epoch: p.Lease.Epoch, Heartbeat: p.Lease.Heartbeat}
		}
		if p.Subscription != "" {
			sub := p.Subscription
			ps.Subscription = &sub
		}
		ps.Skipped = p.Skipped
		if f := p.Failing; f != nil {
			ps.Failing = &failingStatus{Failures: f.Failures, Since: f.Since, Class: f.Class, FailedIn: f.FailedIn, Error: f.Error}
		}
		out.Partitions = append(out.Partitions, ps)
	}
	return out
}

// statusColumn is a column of the status table. A column with optional
// set appears only when some row has a value for it.
type statusColumn struct {
	header   string
	cell     func(p *partitionStatus) string
	optional bool
}

// statusColumns are the status table's columns, in order. To add one,
// add an entry here (and the field to partitionStatus).
var statusColumns = []statusColumn{
	{header: "GROUP", cell: func(p *partitionStatus) string { return p.GroupID }},
	{header: "PARTITION", cell: func(p *partitionStatus) string { return strconv.Itoa(p.PartitionID) }},
	{header: "NEXT OFFSET", cell: func(p *partitionStatus) string { return optInt(p.NextOffset) }},
	{header: "LOG END", cell: func(p *partitionStatus) string { return optInt(p.LogEnd) }},
	{header: "LAG", cell: func(p *partitionStatus) string {
		switch {
		case p.NextOffset == nil:
			return "-"
		case p.LagCapped:
			return ">=" + strconv.FormatInt(p.LagEvents, 10)
		}
		return strconv.FormatInt(p.LagEvents, 10)
	}},
	{header: "LAG AGE", cell: func(p *partitionStatus) string {
		if p.NextOffset == nil {
			return "-"
		}
		return human.Seconds(p.LagSeconds)
	}},
	{header: "DEAD LETTERS", cell: func(p *partitionStatus) string { return strconv.FormatInt(p.DeadLettersOpen, 10) }},
	{header: "HALTED", cell: func(p *partitionStatus) string {
		if p.Halted == nil {
			return "-"
		}
		return fmt.Sprintf("at %d: %s", p.Halted.Offset, shorten(p.Halted.Reason, 60))
	}},
	{header: "FAILING", optional: true, cell: func(p *partitionStatus) string {
		if p.Failing == nil {
			return ""
		}
		return fmt.Sprintf("%d batches since %s (%s, in %s): %s", p.Failing.Failures, p.Failing.Since.Format(time.TimeOnly),
			p.Failing.Class, p.Failing.FailedIn, shorten(p.Failing.Error, 60))
	}},
	{header: "OWNER", optional: true, cell: func(p *partitionStatus) string {
		if p.Lease == nil {
			return ""
		}
		return p.Lease.Owner
	}},
	{header: "EPOCH", optional: true, cell: func(p *partitionStatus) string {
		if p.Lease == nil {
			return ""
		}
		return strconv.FormatInt(p.Lease.Epoch, 10)
	}},
	{header: "HEARTBEAT", optional: true, cell: func(p *partitionStatus) string {
		if p.Lease == nil {
			return ""
		}
		return p.Lease.Heartbeat.Format(time.TimeOnly)
	}},
	{header: "SUBSCRIPTION", optional: true, cell: func(p *partitionStatus) string {
		if p.Subscription == nil {
			return ""
		}
		return *p.Subscription
	}},
	{header: "SKIPPED", optional: true, cell: func(p *partitionStatus) string {
		if p.Skipped == 0 {
			return ""
		}
		return strconv.FormatInt(p.Skipped, 10)
	}},
}

func optInt(v *int64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatInt(*v, 10)
}

// writeStatusTable renders the status document as an aligned table,
// followed by a line of database-wide values.
func writeStatusTable(w io.Writer, s *statusJSON) error {
	var cols []statusColumn
	for _, c := range statusColumns {
		if c.optional && !anyCell(s.Partitions, c) {
			continue
		}
		cols = append(cols, c)
	}
	if len(s.Partitions) == 0 {
		fmt.Fprintf(w, "no consumer group has a position on topic %d\n", s.TopicID)
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for i, c := range cols {
			if i > 0 {
				fmt.Fprint(tw, "\t")
			}
			fmt.Fprint(tw, c.header)
		}
		fmt.Fprintln(tw)
		for i := range s.Partitions {
			for j, c := range cols {
				if j > 0 {
					fmt.Fprint(tw, "\t")
				}
				fmt.Fprint(tw, c.cell(&s.Partitions[i]))
			}
			fmt.Fprintln(tw)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	watcher := "none elected (no consumer runs)"
	if s.Sequencer != nil {
		watcher = "none needed (the sequencer's ticks announce every partition they move)"
	}
	if s.Watcher != nil {
		watcher = fmt.Sprintf("%s, %d waiting", s.Watcher.Session, s.Watcher.Waiting)
	}
	if _, err := fmt.Fprintf(w, "\ntopic %d: %d partitions; notification queue usage %.2f%%; lag counted up to %d events; watcher: %s\n",
		s.TopicID, s.TotalPartitions, 100*s.NotificationQueueUsage, s.LagCap, watcher); err != nil {
		return err
	}
	if s.Sequencer != nil {
		_, err := fmt.Fprintf(w, "sequencer: %s\n", s.Sequencer.describe())
		return err
	}
	return nil
}

// describe says who sequences, when a tick last moved events, and what
// waits: "pgevents sequencer r1, 1 waiting; last tick 3.2s ago; 325
// events staged, not sequenced (oldest 12.5s)".
func (sq *sequencerStatus) describe() string {
	holder := "none (no process sequences the topic: start a consumer, or consumer maintain)"
	if sq.Session != "" {
		holder = fmt.Sprintf("%s, %d waiting", sq.Session, sq.Waiting)
	}
	staged := "nothing staged waits"
	if sq.StagedEvents > 0 {
		n := strconv.FormatInt(sq.StagedEvents, 10)
		if sq.StagedCapped {
			n = ">=" + n
		}
		staged = fmt.Sprintf("%s events staged, not sequenced (oldest %s)", n, human.Seconds(sq.StagedSeconds))
	}
	return fmt.Sprintf("%s; last tick %s ago; %s", holder, human.Seconds(sq.LastTickSeconds), staged)
}

func anyCell(ps []partitionStatus, c statusColumn) bool {
	for i := range ps {
		if c.cell(&ps[i]) != "" {
			return true
		}
	}
	return false
}

// ANSI sequences of --watch: cursor home, then clear the screen.
const ansiHomeClear = "\x1b[H\x1b[2J"

func statusCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := NewFlagSet(ctx, "status", "[--config FILE] [--group G] [--json] [--watch [--interval D]]", statusAbout)
	path := fs.String("config", defaultConfigPath, "configuration file: the groups' databases and topics")
	group := fs.String("group", "", "show this consumer group only (default: every group with a position on the topic)")
	asJSON := fs.Bool("json", false, "print JSON (field names documented above)")
	watch := fs.Bool("watch", false, "refresh every --interval until interrupted")
	interval := fs.Duration("interval", 2*time.Second, "refresh interval of --watch")
	if err := ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("status: unexpected argument %q", fs.Arg(0))
	}
	if *interval <= 0 {
		return usagef("status: --interval must be positive, got %s", *interval)
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	// Each group from its own database: with --group, that group's place;
	// else every (database, schema, topic) of the file's groups.
	var places []place
	if *group != "" {
		p, err := groupPlace(cfg, *group, 0)
		if err != nil {
			return err
		}
		places = []place{p}
	} else {
		places = groupPlaces(cfg)
	}
	type shown struct {
		ctx  context.Context
		pool *pgxpool.Pool
		p    place
	}
	var views []shown
	pools := map[string]*pgxpool.Pool{}
	defer func() {
		for _, p := range pools {
			p.Close()
		}
	}()
	for _, p := range places {
		pool := pools[p.url]
		if pool == nil {
			if _, pool, err = p.open(ctx, cfg, statusPoolSize, *path); err != nil {
				return err
			}
			pools[p.url] = pool
		}
		v := shown{schema.WithName(ctx, p.schema), pool, p}
		if err := knownTopic(v.ctx, pool, p.topic, *path); err != nil {
			return err
		}
		if *group != "" {
			if err := knownGroup(v.ctx, pool, *group, p.topic); err != nil {
				return err
			}
		}
		views = append(views, v)
	}

	show := func() error {
		var b strings.Builder
		if *watch && !*asJSON {
			fmt.Fprintf(&b, "%s%s status, every %s", ansiHomeClear, cmdName(ctx), *interval)
		}
		for i, v := range views {
			rctx, cancel := context.WithTimeout(v.ctx, 30*time.Second)
			st, err := metrics.ReadState(rctx, v.pool, *group, v.p.topic, metrics.DefaultLagCap)
			cancel()
			if err != nil {
				return err
			}
			doc := statusFrom(st)
			rctx, cancel = context.WithTimeout(v.ctx, 30*time.Second)
			wt, err := offsets.Watchers(rctx, v.pool, v.p.topic)
			cancel()
			if err != nil {
				return err
			}
			if wt.Session != "" {
				doc.Watcher = &watcherStatus{Session: wt.Session, Waiting: wt.Waiting}
			}
			doc.Database = dbLabel(v.pool)
			doc.Schema = v.p.schema
			switch {
			case *asJSON && *watch:
				if err := json.NewEncoder(&b).Encode(doc); err != nil { // one document per line
					return err
				}
				continue
			case *asJSON:
				enc := json.NewEncoder(&b)
				enc.SetIndent("", "  ")
				if err := enc.Encode(doc); err != nil {
					return err
				}
				continue
			case *watch && i == 0:
				fmt.Fprintf(&b, ": %s\n\n", doc.DatabaseTime.Local().Format(time.DateTime))
			case i > 0:
				b.WriteString("\n")
			}
			if len(views) > 1 {
				where := doc.Database
				if doc.Schema != "" {
					where += ", schema " + doc.Schema
				}
				fmt.Fprintf(&b, "== %s (%s), topic %d\n", where, v.p.key, doc.TopicID)
			}
			if err := writeStatusTable(&b, &doc); err != nil {
				return err
			}
		}
		_, err := io.WriteString(stdout, b.String()) // one write, so the screen never shows half a table
		return err
	}
	if !*watch {
		return show()
	}
	t := time.NewTicker(*interval)
	defer t.Stop()
	for {
		if err := show(); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// Keep watching through a database restart.
			fmt.Fprintf(stderr, "%s status: %v\n", cmdName(ctx), err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
