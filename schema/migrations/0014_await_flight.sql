-- 0014: a claim's wait for an append in flight has a bound of its own.
--
-- A consumer that saw an append in flight on a partition claims at once and
-- waits, in the claim's round trip, for the append to commit (the
-- partition's flight key, which the append holds shared until its commit).
-- That wait was bounded only by the session's statement_timeout: a producer
-- that kept its transaction open longer failed the batch as transient, and
-- the batch's connection was closed (the wait takes a session lock).
--
-- await_flight waits at most p_timeout_ms (and at most half the session's
-- statement_timeout) for the flight key, then gives up without an error: the claim goes on and reads what is committed, and
-- the appends still in flight are found again by the watcher (or the
-- notification their commit sends when the consumer sleeps). It returns
-- NULL when no append was in flight at the end, or a description of a
-- producer's session that holds the key (pid, application_name, how long
-- its transaction has been open), for the consumer's log. The lock timeout
-- is set for the wait only, and restored; the exception block is a
-- subtransaction that writes nothing, so it takes no transaction id.
CREATE FUNCTION await_flight(p_topic_id integer, p_partition integer, p_timeout_ms integer) RETURNS text
LANGUAGE plpgsql VOLATILE STRICT AS $$
DECLARE
    k bigint := lock_key('flight', p_topic_id || '/' || p_partition);
    old text := current_setting('lock_timeout');
    st double precision := extract(epoch FROM current_setting('statement_timeout')::interval) * 1000;
    holder text;
BEGIN
    IF st > 0 THEN
        p_timeout_ms := least(p_timeout_ms, greatest(1, floor(st / 2)));
    END IF;
    PERFORM set_config('lock_timeout', p_timeout_ms || 'ms', true);
    BEGIN
        PERFORM pg_advisory_lock(k);
        PERFORM pg_advisory_unlock(k);
    EXCEPTION WHEN lock_not_available THEN
        SELECT format('pid %s (application_name %L, transaction open for %s)', a.pid, a.application_name,
                      date_trunc('milliseconds', clock_timestamp() - a.xact_start))
          INTO holder
          FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND ((l.classid::bigint << 32) | l.objid::bigint) = k AND l.objsubid = 1
         ORDER BY a.xact_start
         LIMIT 1;
        holder := coalesce(holder, 'a session that has committed since');
    END;
    PERFORM set_config('lock_timeout', old, true);
    RETURN holder;
END;
$$;
