-- 0012: idempotency keys timed by the clock, and a duplicate's offset read
-- without a race against the deletion of keys past the window.
--
-- The window is measured from the clock time at which a key is claimed
-- (clock_timestamp()), and a key is past it when created_at <
-- clock_timestamp() - window. Until here both sides used now(), the start
-- of the transaction: a producer transaction open longer than the window
-- wrote a key already past it for the next caller, and an immediate retry
-- appended a second event; a session whose transaction started long ago
-- also took keys past the window for live ones. A key appended in a
-- transaction that then stays open longer than the window is still past it
-- when that transaction commits: the window counts from the append, not
-- from the commit.
--
-- A duplicate's partition and offset are read from its key's row right
-- after the INSERT ... ON CONFLICT DO NOTHING that found the row, in the
-- loop that claims the keys, and the claim is taken again when the row is
-- gone by then. Until here they were read after every key of the call was
-- claimed: prune_keys, or another session's claim of a key past the
-- window, could delete the row in between (a later key of the call may
-- wait for another transaction for as long as it stays open), and the
-- duplicate returned a NULL offset. A row deleted between the conflict and
-- the read was past the window (only such rows are deleted; a rolled-back
-- claim is waited for by the INSERT, never seen as a conflict), so the key
-- is absent, and claiming it again (inserting it, or finding the row of a
-- session that claimed it meanwhile) keeps one event per key within the
-- window. The loop ends: each turn needs another row of the key inserted,
-- committed and past the window. Locking the row instead (ON CONFLICT DO
-- UPDATE, or SELECT ... FOR SHARE, which leaves the same gap) would make
-- duplicates of one key wait for each other's transactions, and
-- maintenance wait for theirs; reading the row before the next key is
-- claimed keeps the keys' sorted order, so no session waits for a key while
-- holding one that sorts after it.
ALTER TABLE idempotency_keys ALTER COLUMN created_at SET DEFAULT clock_timestamp();

CREATE OR REPLACE FUNCTION claim_keys(p_topic_id integer, keys text[], p_window interval,
                                      OUT fresh boolean[], OUT dup_partitions integer[], OUT dup_offsets bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    k        text;
    claimed  text[] := '{}';
    dup_keys text[] := '{}';     -- the call's keys found appended, with their rows' values
    dup_p    integer[] := '{}';
    dup_o    bigint[] := '{}';
    r        record;
    i        integer;
    j        integer;
BEGIN
    FOR k IN SELECT DISTINCT u.k FROM unnest(keys) AS u(k) WHERE u.k IS NOT NULL ORDER BY 1 LOOP
        IF k = '' THEN
            RAISE EXCEPTION 'append: an idempotency key must not be empty' USING ERRCODE = '22023';
        END IF;
        LOOP
            -- A key past the window is absent.
            DELETE FROM idempotency_keys ik
             WHERE ik.topic_id = p_topic_id AND ik.key = k AND ik.created_at < clock_timestamp() - p_window;
            INSERT INTO idempotency_keys (topic_id, key, created_at) VALUES (p_topic_id, k, clock_timestamp())
            ON CONFLICT (topic_id, key) DO NOTHING;
            IF FOUND THEN
                claimed := claimed || k;
                EXIT;
            END IF;
            -- A duplicate: the row's values, before the next key is claimed.
            SELECT ik.partition_id, ik.c_offset INTO r FROM idempotency_keys ik WHERE ik.topic_id = p_topic_id AND ik.key = k;
            IF FOUND THEN
                dup_keys := dup_keys || k;
                dup_p := dup_p || r.partition_id;
                dup_o := dup_o || r.c_offset;
                EXIT;
            END IF;
            -- Deleted since the conflict, past the window: claim it again.
        END LOOP;
    END LOOP;
    fresh := '{}';
    dup_partitions := '{}';
    dup_offsets := '{}';
    FOR i IN 1 .. coalesce(cardinality(keys), 0) LOOP
        k := keys[i];
        IF k IS NULL OR (k = ANY (claimed) AND array_position(keys, k) = i) THEN
            fresh := fresh || true;
            dup_partitions := dup_partitions || NULL::integer;
            dup_offsets := dup_offsets || NULL::bigint;
        ELSIF k = ANY (claimed) THEN
            -- A key repeated within the call: append_events_keyed fills in
            -- its first occurrence's.
            fresh := fresh || false;
            dup_partitions := dup_partitions || NULL::integer;
            dup_offsets := dup_offsets || NULL::bigint;
        ELSE
            j := array_position(dup_keys, k);
            fresh := fresh || false;
            dup_partitions := dup_partitions || dup_p[j];
            dup_offsets := dup_offsets || dup_o[j];
        END IF;
    END LOOP;
END;
$$;

-- prune_keys deletes a topic's idempotency keys past its window, and
-- returns how many it deleted. Maintenance runs it at every pass. The
-- cutoff is read from the clock once, so that the index on (topic_id,
-- created_at) bounds the scan.
CREATE OR REPLACE FUNCTION prune_keys(p_topic_id integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    cutoff timestamptz;
    n      bigint;
BEGIN
    SELECT clock_timestamp() - lc.idempotency_window INTO cutoff FROM log_counter lc WHERE lc.topic_id = p_topic_id;
    DELETE FROM idempotency_keys ik
     WHERE ik.topic_id = p_topic_id AND ik.created_at < cutoff;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;
