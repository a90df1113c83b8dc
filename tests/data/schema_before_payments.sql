-- schema.sql as it was before payments (commit fbc880a): tests/test_db.py upgrades a database
-- created by it with today's schema.sql. Kept as it was; never edit it.

-- webhook-ledger schema. Safe to apply twice: every statement is IF NOT EXISTS
-- or OR REPLACE. Needs PostgreSQL 14 or later (CREATE OR REPLACE TRIGGER).

-- The ledger: one row per user, credited by payment events. The opening
-- balance is the balance the row was created with (set by the trigger below
-- unless given), so that `flask ledger verify` can prove
-- balance = opening + the sum of the user's ledger_credits.
CREATE TABLE IF NOT EXISTS user_balances (
    user_id               UUID PRIMARY KEY,
    balance_cents         BIGINT NOT NULL DEFAULT 0,
    opening_balance_cents BIGINT NOT NULL,
    created_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at            TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One row per (source, provider event id), ever (until `flask events purge`
-- deletes it). The UNIQUE constraint on (source, event_id) is what the whole
-- design rests on: two deliveries of one event cannot both insert, whatever
-- Redis says; two sources may use the same id. A row is committed either
-- 'completed' (its effect committed in the same transaction) or 'failed' (no
-- effect; a later delivery of the same event, or `flask events replay`,
-- tries again). 'processing' is only ever seen inside the transaction that
-- inserted it.
CREATE TABLE IF NOT EXISTS webhook_events (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- 'default' for POST /api/webhooks, else a name from WEBHOOK_SOURCES.
    source           TEXT NOT NULL DEFAULT 'default' CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    event_id         TEXT NOT NULL CHECK (char_length(event_id) BETWEEN 1 AND 128),
    event_type       TEXT NOT NULL CHECK (char_length(event_type) BETWEEN 1 AND 64),
    status           TEXT NOT NULL DEFAULT 'processing'
                     CHECK (status IN ('processing', 'completed', 'failed')),
    -- The exact bytes received: the event of record, which replay and
    -- verify parse. NULL only on rows stored before the bytes were kept.
    body             BYTEA,
    payload          JSONB NOT NULL,          -- the same body, for querying
    attempts         INTEGER NOT NULL DEFAULT 1 CHECK (attempts >= 1),
    last_error       TEXT,                    -- why the last attempt failed, while it is failed
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at     TIMESTAMPTZ,
    -- SHA-256 of body (of the bytes received, on rows stored before body).
    payload_sha256   BYTEA NOT NULL CHECK (octet_length(payload_sha256) = 32),
    -- SHA-256 of the event's effect (events.effect_of): a later delivery of
    -- the id with another effect is refused (409 payload_mismatch) and only
    -- counted; the same effect in other bytes is the same event. NULL only
    -- on rows stored before effects were kept (their bytes are compared).
    effect_sha256    BYTEA CHECK (octet_length(effect_sha256) = 32),
    mismatches       INTEGER NOT NULL DEFAULT 0 CHECK (mismatches >= 0),
    last_mismatch_at TIMESTAMPTZ,
    CONSTRAINT webhook_events_source_event_id_key UNIQUE (source, event_id)
);

-- Operators look for failed events.
CREATE INDEX IF NOT EXISTS webhook_events_status_idx
    ON webhook_events (status) WHERE status <> 'completed';
-- `flask events list` shows the newest first; `flask events purge` deletes
-- the oldest completed ones in batches.
CREATE INDEX IF NOT EXISTS webhook_events_created_at_idx
    ON webhook_events (created_at);

-- The ledger's journal, append-only: one row per credit, written in the
-- transaction that credits user_balances. It outlives the webhook_events row
-- (purge keeps it; hence no foreign key), and its UNIQUE (source, event_id)
-- stops an event whose row was purged from being credited again, or marked
-- failed, if it is redelivered.
CREATE TABLE IF NOT EXISTS ledger_credits (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source       TEXT NOT NULL DEFAULT 'default' CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    event_id     TEXT NOT NULL CHECK (char_length(event_id) BETWEEN 1 AND 128),
    user_id      UUID NOT NULL REFERENCES user_balances (user_id),
    amount_cents BIGINT NOT NULL CHECK (amount_cents > 0),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT ledger_credits_source_event_id_key UNIQUE (source, event_id)
);
CREATE INDEX IF NOT EXISTS ledger_credits_user_idx ON ledger_credits (user_id);

-- Upgrade of a database created before sources, kept bytes and effects
-- (each step is a no-op on a database created by the statements above).
-- Existing rows belong to the default source; they have no kept bytes and
-- no effect, so their re-deliveries are compared by bytes, as they were.
-- The new unique index is built before the old constraint goes, so that no
-- moment is without one. Building it blocks writes to the table: on a big
-- table, apply this while deliveries are paused (they answer 503 and are
-- retried).
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS source TEXT NOT NULL DEFAULT 'default'
    CHECK (source ~ '^[a-z0-9-]{1,64}$');
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS body BYTEA;
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS effect_sha256 BYTEA
    CHECK (octet_length(effect_sha256) = 32);
CREATE UNIQUE INDEX IF NOT EXISTS webhook_events_source_event_id_key ON webhook_events (source, event_id);
ALTER TABLE webhook_events DROP CONSTRAINT IF EXISTS webhook_events_event_id_key;
ALTER TABLE ledger_credits ADD COLUMN IF NOT EXISTS source TEXT NOT NULL DEFAULT 'default'
    CHECK (source ~ '^[a-z0-9-]{1,64}$');
CREATE UNIQUE INDEX IF NOT EXISTS ledger_credits_source_event_id_key ON ledger_credits (source, event_id);
ALTER TABLE ledger_credits DROP CONSTRAINT IF EXISTS ledger_credits_event_id_key;

-- A user row's opening balance is its balance at insert, unless given.
CREATE OR REPLACE FUNCTION user_balances_set_opening() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.opening_balance_cents := coalesce(NEW.opening_balance_cents, NEW.balance_cents);
    RETURN NEW;
END
$$;
CREATE OR REPLACE TRIGGER user_balances_set_opening
    BEFORE INSERT ON user_balances
    FOR EACH ROW EXECUTE FUNCTION user_balances_set_opening();
