-- 0021: a batch at the floor: BEGIN, one claim statement, the handlers, one
-- statement for the position, COMMIT.
--
-- Until here a batch sent, besides BEGIN and COMMIT, four statements: one
-- that named the batch's owner in application_name, switched the
-- transaction to generic plans and took the position lock; the claim;
-- one that checked the lease and the pause, read the position and put the
-- plan mode back; and commit_position, which inserted the position and
-- checked the lease again. Measured with pg_stat_statements at 1,000
-- single-event transactions a second: 0.87 of each per event.
--
-- claim_state takes the position lock and reads what the claim depends on
-- in a snapshot taken after it: it is VOLATILE PL/pgSQL, and in READ
-- COMMITTED each statement of a volatile function reads in a snapshot of
-- its own. A claim statement calls it first (a LATERAL join on its row) and
-- reads the events from the position it returns, in the claim statement's
-- own snapshot, taken when the statement started, before the lock:
--
--   - the position, the lease and the pause are read after the lock, so
--     they are what the lock's previous holder committed (an operator's
--     reset or pause, a Kafka commit, a takeover's batch): invariants 2 and
--     3, and nothing handled after a pause returned;
--   - the events from that position are read in an older snapshot: offsets
--     are gapless and commit-ordered (invariant 1), so what it shows from
--     the position on is a prefix of what will ever be there, and the next
--     batch goes on from the first offset this one did not handle. The cut
--     of the next layout is read in the same snapshot as the events (as
--     before: an event past a cut is never visible without the cut).
--
-- The owner is marked by its batch key (lock_key('batch', owner), shared),
-- not by renaming the session: batch_backends (migration 0018) finds the
-- batches of a replica that lost its lease, for the takeover's fence and
-- for hold_group.
--
-- The position is then inserted by a plain INSERT in the commit's round
-- trip. The lease is not checked again there: the claim checked it under
-- the position lock, which the batch holds to its end, and a takeover
-- cannot have handled anything meanwhile (its claim waits for that lock);
-- a replica that lost its lease while frozen is ended by the fence before
-- the new owner's claim takes the lock, and its database effects go with
-- its transaction. Handlers stop on a lost lease when the heartbeat finds
-- it (ErrLeaseLost), as before.
CREATE FUNCTION claim_state(p_group text, p_topic_id integer, p_partition integer, p_owner text, p_epoch bigint,
                            OUT held boolean, OUT paused boolean, OUT next_offset bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The owner's key first: a claim that waits for the position lock is
    -- already known as the owner's.
    PERFORM pg_advisory_xact_lock_shared(lock_key('batch', p_owner));
    PERFORM lock_position(p_group, p_topic_id, p_partition);
    SELECT EXISTS (SELECT 1 FROM partition_leases l
                    WHERE l.group_id = p_group AND l.topic_id = p_topic_id AND l.partition_id = p_partition
                      AND l.owner = p_owner AND l.epoch = p_epoch),
           EXISTS (SELECT 1 FROM subscriptions s
                    WHERE s.group_id = p_group AND s.topic_id = p_topic_id AND s.state = 'PAUSED'),
           (SELECT o.next_offset FROM consumer_positions o
             WHERE o.group_id = p_group AND o.topic_id = p_topic_id AND o.partition_id = p_partition
             ORDER BY o.seq DESC LIMIT 1)
      INTO held, paused, next_offset;
END;
$$;
