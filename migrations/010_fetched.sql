-- 010: the provider's bytes of a fetched event, beside the delivered ones
-- (schema.sql, webhook_events.fetched). No row is rewritten: NULL for all.
ALTER TABLE webhook_events ADD COLUMN fetched BYTEA;
