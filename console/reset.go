package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/offsets"
)

// movePreview is what a reset does to one partition: the position before
// and after, and the events that replays (To < From) or skips (To > From).
type movePreview struct {
	Partition int
	From      int64 // -1: no position before
	To        int64
	Replay    int64
	Skip      int64
	Estimated bool // more than previewCountCap events: Replay or Skip is an estimate
}

// previewCountCap caps the events a reset preview counts per partition
// (through the log's index); beyond it the preview shows an estimate from
// the offsets, as the lag does (lagEstimate). Counting every event a reset
// of a group halfway through a 10-million-event log replays took seconds.
const previewCountCap = 1000

// resetData is the reset confirmation's.
type resetData struct {
	Topic     int
	Group     string
	To        string // earliest, latest, offset or time
	Value     string // the offset or the time
	Force     bool
	Start     string // the start position, as the CLI spells it
	Moves     []movePreview
	Replay    int64
	Skip      int64
	Estimated bool   // some partition's figure is an estimate
	Expect    string // the previewed positions, "partition:offset,..."
	Error     string // why the preview failed
	Running   bool   // it failed because a replica runs: force is offered
	Notice    string // the positions changed since the confirmation shown
}

// parseStart reads the reset form's target as pgevents.ParseStartPosition
// does for the CLI's --to: kind earliest, latest, offset (value N) or
// time (value RFC 3339, or a form's local date-time taken as UTC).
func parseStart(kind, value string) (offsets.Start, string, error) {
	spec := kind
	switch kind {
	case "offset":
		spec = "offset:" + strings.TrimSpace(value)
	case "time":
		v := strings.TrimSpace(value)
		for _, layout := range []string{"2006-01-02T15:04", "2006-01-02T15:04:05", "2006-01-02 15:04:05"} {
			if t, err := time.Parse(layout, v); err == nil {
				v = t.UTC().Format(time.RFC3339Nano)
				break
			}
		}
		spec = "time:" + v
	}
	sp, err := pgevents.ParseStartPosition(spec)
	if err != nil {
		return offsets.Start{}, spec, err
	}
	return offsets.Start{Kind: sp.Kind, Offset: sp.Offset, Time: sp.Time}, sp.String(), nil
}

// reset previews a reset of the group's positions or, with confirm=1,
// does it. The preview runs offsets.Reset in a transaction that rolls
// back and counts, in it, the events each partition replays or skips. The
// confirmation carries the previewed positions (expect): the reset
// commits only if it moves the group exactly there, except that a reset
// to latest may go further when events were appended since (it then says
// how many more it skipped); otherwise nothing changes and a new
// confirmation is shown (409).
func (c *Console) reset(w http.ResponseWriter, r *http.Request, a *actor) {
	topic, group, err := groupTarget(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	d := resetData{Topic: topic, Group: group, To: r.PostFormValue("to"), Value: r.PostFormValue("value"),
		Force: r.PostFormValue("force") != ""}
	start, spec, err := parseStart(d.To, d.Value)
	d.Start = spec
	if err != nil {
		d.Error = err.Error()
		c.answerReset(w, r, http.StatusBadRequest, &d)
		return
	}
	ctx := c.actionContext(r)
	scope, partitions, err := c.topicScope(ctx, topic)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, c.redact(err.Error()))
		return
	}
	confirm := r.PostFormValue("confirm") == "1"
	expect := r.PostFormValue("expect")
	e := auditEntry{Action: "reset", Topic: ptr(int32(topic)), Group: &group}
	var mismatch string
	err = c.inTx(ctx, func(tx pgx.Tx) error {
		// offsets.Reset on tx works in a savepoint of it: what it did is
		// counted, then kept (confirmed) or rolled back (a preview).
		moves, err := offsets.Reset(ctx, tx, group, topic, start, d.Force)
		if err != nil {
			return err
		}
		if d.Moves, err = countMoves(ctx, tx, topic, moves, scope, partitions); err != nil {
			return err
		}
		d.Expect = expectOf(d.Moves)
		for _, m := range d.Moves {
			d.Estimated = d.Estimated || m.Estimated
			d.Replay += m.Replay
			d.Skip += m.Skip
		}
		if !confirm {
			return errPreview
		}
		if expect != "" {
			if mismatch = compareExpect(expect, d.Moves, start.Kind == "latest"); mismatch != "" {
				return errPreview
			}
		}
		e.Detail = resetDetail(spec, d.Force, d.Moves, d.Replay, d.Skip, expect)
		e.Outcome = "ok"
		return c.record(ctx, tx, a, e)
	})
	switch {
	case errors.Is(err, errPreview) && mismatch != "":
		d.Notice = "the group's positions changed since the confirmation you saw (" + mismatch + "): nothing was done; here is what the reset does now"
		e.Outcome, e.Detail = "not done: positions changed since the preview", spec
		c.logAction(a, e, nil)
		if rerr := c.record(ctx, c.pool, a, e); rerr != nil {
			c.log.Error().Err(rerr).Msg("audit of a reset not done")
		}
		c.answerReset(w, r, http.StatusConflict, &d)
	case errors.Is(err, errPreview):
		c.answerReset(w, r, http.StatusOK, &d)
	case err != nil && !confirm:
		d.Error, d.Running, d.Moves = c.redact(err.Error()), errors.Is(err, offsets.ErrGroupRunning), nil
		c.answerReset(w, r, http.StatusConflict, &d)
	default:
		e.Detail = cmpDetail(e.Detail, spec)
		c.finish(w, r, a, e, err, groupPath(topic, group), http.StatusConflict)
	}
}

var errPreview = errors.New("preview: rolled back")

func cmpDetail(detail, spec string) string {
	if detail == "" {
		return "to " + spec
	}
	return detail
}

// answerReset shows the confirmation (or the preview's failure), as JSON to
// a script.
func (c *Console) answerReset(w http.ResponseWriter, r *http.Request, status int, d *resetData) {
	if wantsJSON(r) {
		writeJSON(w, status, map[string]any{"start": d.Start, "force": d.Force, "moves": d.Moves, "replay": d.Replay,
			"skip": d.Skip, "expect": d.Expect, "error": d.Error, "notice": d.Notice})
		return
	}
	c.renderStatus(w, r, status, "reset", "Reset "+d.Group, d)
}

// countMoves counts, in tx, the events each move replays or skips, up to
// previewCountCap a partition (offsets.CountUpTo), and estimates beyond
// from the offsets (the topic's offset scope and partition count, as
// lagEstimate).
func countMoves(ctx context.Context, tx pgx.Tx, topic int, moves []offsets.Move, scope string, partitions int) ([]movePreview, error) {
	counted, err := offsets.CountUpTo(ctx, tx, topic, moves, previewCountCap)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	out := make([]movePreview, 0, len(counted))
	for _, c := range counted {
		m := movePreview{Partition: c.Partition, From: c.From, To: c.To, Replay: c.Replay, Skip: c.Skip}
		if n := c.Replay + c.Skip; n >= previewCountCap {
			span := max(m.From, m.To) - min(m.From, m.To)
			if scope != "partition" && partitions > 1 {
				span /= int64(partitions)
			}
			n, m.Estimated = max(n, span), true
			if m.Replay > 0 {
				m.Replay = n
			} else {
				m.Skip = n
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// expectOf writes the positions a reset moves to, "partition:offset,...".
func expectOf(moves []movePreview) string {
	parts := make([]string, len(moves))
	for i, m := range moves {
		parts[i] = strconv.Itoa(m.Partition) + ":" + strconv.FormatInt(m.To, 10)
	}
	return strings.Join(parts, ",")
}

// compareExpect says how moves differ from the previewed positions
// expect, or "" when they agree: the same partitions and positions, or,
// with further (a reset to latest), positions at or past the previewed
// ones.
func compareExpect(expect string, moves []movePreview, further bool) string {
	want := map[int]int64{}
	for _, kv := range strings.Split(expect, ",") {
		p, o, ok := strings.Cut(kv, ":")
		pi, err1 := strconv.Atoi(p)
		oi, err2 := strconv.ParseInt(o, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return "the confirmation's positions cannot be read"
		}
		want[pi] = oi
	}
	if len(want) != len(moves) {
		return fmt.Sprintf("%d partitions, not %d", len(moves), len(want))
	}
	var diffs []string
	for _, m := range moves {
		w, ok := want[m.Partition]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("partition %d is new", m.Partition))
		case m.To == w, further && m.To > w:
		default:
			diffs = append(diffs, fmt.Sprintf("partition %d: %d, not %d", m.Partition, m.To, w))
		}
	}
	slices.Sort(diffs)
	return strings.Join(diffs, "; ")
}

// resetDetail describes a reset done, for the audit row.
func resetDetail(spec string, force bool, moves []movePreview, replay, skip int64, expect string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "to %s", spec)
	if force {
		b.WriteString(" (forced)")
	}
	fmt.Fprintf(&b, ": replays %d, skips %d;", replay, skip)
	for _, m := range moves {
		from := "-"
		if m.From >= 0 {
			from = strconv.FormatInt(m.From, 10)
		}
		fmt.Fprintf(&b, " p%d %s->%d", m.Partition, from, m.To)
	}
	if expect != "" && expect != expectOf(moves) {
		fmt.Fprintf(&b, " (previewed %s: appended since)", expect)
	}
	return b.String()
}
