-- 0024: SQL callers stage events at the Go statement's cost.
--
-- append_event is a SQL function whose body the planner inlines into the
-- caller's statement; but two of the functions it reaches were SQL
-- functions that cannot be inlined (topic_sequenced reads log_counter in a
-- subquery; wake_sequencer, called from PL/pgSQL, is a statement of its
-- own). PostgreSQL plans such a function's statement again at every call
-- (a SQL function's plan lives as long as the calling statement), and
-- PL/pgSQL keeps its statements' plans for the session. Measured with
-- pgbench, 16 clients of `SELECT append_event(...)` in autocommit
-- (prepared), single events, a sequenced topic without a consumer, on this
-- project's 2-core machine, durable commits: 7,100-7,600 tx/s, against
-- 13,700-14,600 for the statement Go's AppendCommit sends; stage_one
-- called directly, 9,300-9,700; with wake_sequencer in PL/pgSQL,
-- 12,600-14,200; and append_event with both in PL/pgSQL, 12,800-13,500.
--
-- Both become PL/pgSQL with the same semantics (Migrate pins their
-- search_path, as every PL/pgSQL function's). topic_sequenced is called
-- by append_event and append_events for every topic, so appends to the
-- other scopes from SQL save the same planning. Nothing else changes: an
-- append that finds the sequencer's sleep key held (the sequencer sleeps)
-- notifies it, one that takes it shared holds it to commit (0016).
CREATE OR REPLACE FUNCTION wake_sequencer(p_topic_id integer) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(lock_key('sequencer', p_topic_id || '/sleep')) THEN
        PERFORM pg_notify('pgevents_sequencer', p_topic_id::text);
    END IF;
END;
$$;

-- topic_sequenced tells whether a topic is sequenced (false for one that
-- does not exist: the append then says so).
CREATE OR REPLACE FUNCTION topic_sequenced(p_topic_id integer) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce((SELECT c.sequenced FROM log_counter c WHERE c.topic_id = p_topic_id), false);
END;
$$;
