-- webhook-ledger schema. Safe to apply twice: every statement is IF NOT EXISTS.

-- The ledger: one row per user, credited by payment events.
CREATE TABLE IF NOT EXISTS user_balances (
    user_id       UUID PRIMARY KEY,
    balance_cents BIGINT NOT NULL DEFAULT 0,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One row per provider event id, ever. The UNIQUE constraint on event_id is
-- what the whole design rests on: two deliveries of one event cannot both
-- insert, whatever Redis says. A row is committed either 'completed' (its
-- effect committed in the same transaction) or 'failed' (no effect; a later
-- delivery of the same event tries again). 'processing' is only ever seen
-- inside the transaction that inserted it.
CREATE TABLE IF NOT EXISTS webhook_events (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     TEXT NOT NULL UNIQUE CHECK (char_length(event_id) BETWEEN 1 AND 128),
    event_type   TEXT NOT NULL CHECK (char_length(event_type) BETWEEN 1 AND 64),
    status       TEXT NOT NULL DEFAULT 'processing'
                 CHECK (status IN ('processing', 'completed', 'failed')),
    payload      JSONB NOT NULL,          -- the whole event body as received
    attempts     INTEGER NOT NULL DEFAULT 1 CHECK (attempts >= 1),
    last_error   TEXT,                    -- why the last attempt failed, if one did
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at TIMESTAMPTZ
);

-- Operators look for failed events.
CREATE INDEX IF NOT EXISTS webhook_events_status_idx
    ON webhook_events (status) WHERE status <> 'completed';
