-- `flask audit SOURCE`: the ledger held against the provider's own money
-- records (Stripe's balance transactions). Each run and each break it found,
-- by a stable id (its class and keys), so that a rerun finds the same break
-- again rather than a new one (docs/design.md, "Books against the provider").
CREATE TABLE IF NOT EXISTS audit_runs (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source        TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    account       TEXT NOT NULL DEFAULT '' CHECK (account = '' OR account ~ '^acct_[A-Za-z0-9]{1,250}$'),
    since         TIMESTAMPTZ NOT NULL,
    until         TIMESTAMPTZ NOT NULL,
    grace_seconds INTEGER NOT NULL CHECK (grace_seconds >= 0),
    verdict       TEXT NOT NULL DEFAULT 'running'
                  CHECK (verdict IN ('running', 'reconciled', 'reconciled_with_pending', 'breaks', 'incomplete')),
    reason        TEXT,
    listed        INTEGER NOT NULL DEFAULT 0 CHECK (listed >= 0),
    pending       INTEGER NOT NULL DEFAULT 0 CHECK (pending >= 0),
    breaks        INTEGER NOT NULL DEFAULT 0 CHECK (breaks >= 0),
    statements    JSONB,
    started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at   TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS audit_runs_source_idx ON audit_runs (source, account, verdict, finished_at);

CREATE TABLE IF NOT EXISTS audit_breaks (
    source           TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    break_id         TEXT NOT NULL CHECK (break_id ~ '^brk_[0-9a-f]{20}$'),
    account          TEXT NOT NULL DEFAULT '',
    class            TEXT NOT NULL CHECK (class IN ('missing_in_ledger', 'missing_at_provider', 'amount_mismatch',
                                                    'currency_mismatch', 'state_mismatch', 'user_mismatch',
                                                    'matched_by_amount_only', 'unknown_provider_type')),
    priority         BOOLEAN NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('new', 'persisting', 'resolved')),
    provider_key     TEXT,
    ledger_key       TEXT,
    provider_amount  BIGINT,
    ledger_amount    BIGINT,
    provider_currency TEXT,
    ledger_currency  TEXT,
    provider_user    TEXT,
    ledger_user      TEXT,
    occurred_at      TIMESTAMPTZ NOT NULL,
    detail           TEXT NOT NULL,
    fix              TEXT NOT NULL,
    runs_seen        INTEGER NOT NULL DEFAULT 1 CHECK (runs_seen >= 1),
    first_run        BIGINT NOT NULL REFERENCES audit_runs (id),
    last_run         BIGINT NOT NULL REFERENCES audit_runs (id),
    first_seen_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    resolved_run     BIGINT REFERENCES audit_runs (id),
    resolved_at      TIMESTAMPTZ,
    PRIMARY KEY (source, break_id)
);
CREATE INDEX IF NOT EXISTS audit_breaks_open_idx ON audit_breaks (source, account, status);
