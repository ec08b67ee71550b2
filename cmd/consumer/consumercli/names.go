package consumercli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/pgevents/pgevents/metrics"
	"github.com/pgevents/pgevents/schema"
)

// This file: the names an operator gives on the command line (--group,
// --topic) checked against the database, so that a typo is an error
// naming it rather than an empty table.

// knownTopic returns nil when topic exists in the schema of ctx on db,
// or an error naming it and saying how to create it.
func knownTopic(ctx context.Context, db schema.DB, topic int, path string) error {
	_, err := schema.LookupTopic(ctx, db, topic)
	if errors.Is(err, schema.ErrTopicNotFound) {
		return fmt.Errorf("topic %d does not exist%s: check its id (--topic, or the file's topicId), or create it with `%s migrate --config %s`",
			topic, inSchema(ctx), cmdName(ctx), path)
	}
	return err
}

// knownGroup returns nil when group has a subscription or a position on
// topic (in the schema of ctx on db), or an error naming it and the
// groups the topic has.
func knownGroup(ctx context.Context, db schema.DB, group string, topic int) error {
	st, err := metrics.ReadState(ctx, db, "", topic, 1)
	if err != nil {
		return err
	}
	var groups []string
	for _, p := range st.Partitions {
		if p.Group == group && (p.NextOffset != nil || p.Subscription != "") {
			return nil
		}
		if !slices.Contains(groups, p.Group) {
			groups = append(groups, p.Group)
		}
	}
	there := "the topic has no group yet"
	if len(groups) > 0 {
		slices.Sort(groups)
		there = "groups there: " + strings.Join(groups, ", ")
	}
	return fmt.Errorf("group %q has no subscription and no position on topic %d%s (%s): no consumer of that group ever ran there",
		group, topic, inSchema(ctx), there)
}

// inSchema says where ctx names pgevents' objects, for a message: "" for
// the first schema of the search_path.
func inSchema(ctx context.Context) string {
	if n := schema.Name(ctx); n != "" {
		return " in schema " + n
	}
	return ""
}
