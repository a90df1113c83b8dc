-- 007: `flask reconcile`, which recovers from the provider's event list the
-- events whose deliveries were lost. Tables only: money.sql's apply_event
-- gains p_origin, which it records here.

-- Where an event's bytes of record came from; every row stored before came
-- from a delivery.
ALTER TABLE webhook_events ADD COLUMN origin TEXT NOT NULL DEFAULT 'delivery'
    CHECK (origin IN ('delivery', 'reconcile'));

CREATE TABLE reconcile_runs (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source      TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    since       TIMESTAMPTZ NOT NULL,
    until       TIMESTAMPTZ NOT NULL,
    status      TEXT NOT NULL DEFAULT 'running'
                CHECK (status IN ('running', 'completed', 'incomplete', 'failed', 'interrupted', 'yielded')),
    pages       INTEGER NOT NULL DEFAULT 0 CHECK (pages >= 0),
    listed      INTEGER NOT NULL DEFAULT 0 CHECK (listed >= 0),
    applied     INTEGER NOT NULL DEFAULT 0 CHECK (applied >= 0),
    duplicates  INTEGER NOT NULL DEFAULT 0 CHECK (duplicates >= 0),
    refused     INTEGER NOT NULL DEFAULT 0 CHECK (refused >= 0),
    message     TEXT,
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ
);
CREATE INDEX reconcile_runs_source_idx ON reconcile_runs (source, status, finished_at);

CREATE TABLE reconcile_watermarks (
    source           TEXT PRIMARY KEY CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    reconciled_until TIMESTAMPTZ,
    run_id           BIGINT REFERENCES reconcile_runs (id),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
