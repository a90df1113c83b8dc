-- webhook-ledger schema. Safe to apply twice: every statement is IF NOT EXISTS,
-- OR REPLACE, or guarded, and a database made by an earlier version of this
-- file is brought up to date in place.

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

-- One row per provider event id, ever (until `flask events purge` deletes
-- it). The UNIQUE constraint on event_id is what the whole design rests on:
-- two deliveries of one event cannot both insert, whatever Redis says. A row
-- is committed either 'completed' (its effect committed in the same
-- transaction) or 'failed' (no effect; a later delivery of the same event, or
-- `flask events replay`, tries again). 'processing' is only ever seen inside
-- the transaction that inserted it.
CREATE TABLE IF NOT EXISTS webhook_events (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id         TEXT NOT NULL UNIQUE CHECK (char_length(event_id) BETWEEN 1 AND 128),
    event_type       TEXT NOT NULL CHECK (char_length(event_type) BETWEEN 1 AND 64),
    status           TEXT NOT NULL DEFAULT 'processing'
                     CHECK (status IN ('processing', 'completed', 'failed')),
    payload          JSONB NOT NULL,          -- the whole event body as received
    attempts         INTEGER NOT NULL DEFAULT 1 CHECK (attempts >= 1),
    last_error       TEXT,                    -- why the last attempt failed, if one did
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at     TIMESTAMPTZ
);

-- Columns added after the first release, so also on existing tables.
-- SHA-256 of the raw request body. A later delivery with the same id and
-- different bytes is refused (409 payload_mismatch) and only counted here.
-- NULL on rows stored before the column existed: those are not compared.
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS payload_sha256 BYTEA
    CHECK (payload_sha256 IS NULL OR octet_length(payload_sha256) = 32);
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS mismatches INTEGER NOT NULL DEFAULT 0
    CHECK (mismatches >= 0);
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS last_mismatch_at TIMESTAMPTZ;

-- Operators look for failed events.
CREATE INDEX IF NOT EXISTS webhook_events_status_idx
    ON webhook_events (status) WHERE status <> 'completed';
-- `flask events list` shows the newest first; `flask events purge` deletes
-- the oldest completed ones in batches.
CREATE INDEX IF NOT EXISTS webhook_events_created_at_idx
    ON webhook_events (created_at);

-- The ledger's journal, append-only: one row per credit, written in the
-- transaction that credits user_balances. It outlives the webhook_events row
-- (purge keeps it; hence no foreign key), and its UNIQUE event_id stops an
-- event whose row was purged from being credited again if it is redelivered.
CREATE TABLE IF NOT EXISTS ledger_credits (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     TEXT NOT NULL UNIQUE CHECK (char_length(event_id) BETWEEN 1 AND 128),
    user_id      UUID NOT NULL REFERENCES user_balances (user_id),
    amount_cents BIGINT NOT NULL CHECK (amount_cents > 0),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ledger_credits_user_idx ON ledger_credits (user_id);

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

-- Upgrade of a database made before opening balances and ledger_credits
-- existed, once: journal the completed payments that are still stored, and
-- take the opening balance to be what the balance was before them.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                   WHERE table_schema = current_schema() AND table_name = 'user_balances'
                     AND column_name = 'opening_balance_cents') THEN
        ALTER TABLE user_balances ADD COLUMN opening_balance_cents BIGINT;
        INSERT INTO ledger_credits (event_id, user_id, amount_cents, created_at)
        SELECT event_id, (payload->'data'->>'userId')::uuid,
               (payload->'data'->>'amountCents')::bigint, coalesce(completed_at, updated_at)
        FROM webhook_events
        WHERE status = 'completed' AND event_type = 'payment.succeeded'
        ON CONFLICT (event_id) DO NOTHING;
        UPDATE user_balances u
        SET opening_balance_cents = u.balance_cents
            - coalesce((SELECT sum(c.amount_cents) FROM ledger_credits c WHERE c.user_id = u.user_id), 0);
        ALTER TABLE user_balances ALTER COLUMN opening_balance_cents SET NOT NULL;
    END IF;
END
$$;
