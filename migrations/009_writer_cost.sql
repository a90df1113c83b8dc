-- 009: what each event costs the one PostgreSQL writer (docs/performance.md).
-- No table is rewritten: an index is swapped and a view added.

-- The B-tree on created_at took an entry per event for queries that the
-- primary key serves in the same order (ids grow with arrival): `events list`
-- reads newest first by id, `events purge` oldest first. What remains of
-- created_at's use, finding where a time begins, a BRIN index does, with one
-- summary per 128 pages, which a new event's insert does not write.
DROP INDEX webhook_events_created_at_idx;
CREATE INDEX webhook_events_created_at_brin ON webhook_events USING brin (created_at) WITH (autosummarize = on);

-- The body as jsonb, for an operator's queries, computed when read: the
-- table keeps one copy of each event, its bytes. NULL where jsonb cannot
-- hold the body (\u0000, a lone surrogate escape, a number beyond numeric's
-- range). Rows stored by an earlier release keep their copy in payload.
CREATE FUNCTION event_json(p_body bytea) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN convert_from(p_body, 'UTF8')::jsonb;
EXCEPTION WHEN data_exception THEN  -- class 22: not UTF-8, or not a value jsonb holds
    RETURN NULL;
END
$$;
CREATE VIEW webhook_events_json AS
    SELECT id, source, event_id, event_type, status, created_at, completed_at, last_error,
           coalesce(payload, event_json(body)) AS payload
    FROM webhook_events;
