-- 001: sources, kept bytes and effects. Takes a database created by the
-- release before sources (tests/data/schema_before_sources.sql) to the
-- release before payments (tests/data/schema_before_payments.sql).
--
-- Existing rows belong to the default source. They have no kept bytes and no
-- effect (neither can be made up afterwards), so their re-deliveries are
-- compared on their bytes, as they were. Each new unique index is built
-- before the old constraint goes, so that no moment is without one.
-- Building it blocks writes to the table: on a big table, run `flask
-- init-db` while deliveries are paused (they answer 503 and are retried).
ALTER TABLE webhook_events ADD COLUMN source TEXT NOT NULL DEFAULT 'default'
    CHECK (source ~ '^[a-z0-9-]{1,64}$');
ALTER TABLE webhook_events ADD COLUMN body BYTEA;
ALTER TABLE webhook_events ADD COLUMN effect_sha256 BYTEA
    CHECK (octet_length(effect_sha256) = 32);
CREATE UNIQUE INDEX webhook_events_source_event_id_key ON webhook_events (source, event_id);
ALTER TABLE webhook_events DROP CONSTRAINT webhook_events_event_id_key;

ALTER TABLE ledger_credits ADD COLUMN source TEXT NOT NULL DEFAULT 'default'
    CHECK (source ~ '^[a-z0-9-]{1,64}$');
CREATE UNIQUE INDEX ledger_credits_source_event_id_key ON ledger_credits (source, event_id);
ALTER TABLE ledger_credits DROP CONSTRAINT ledger_credits_event_id_key;
