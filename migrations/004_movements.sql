-- 004: every way money moves on a payment. Takes a database of the release
-- before movements (tests/data/schema_before_movements.sql) to schema.sql as
-- this migration was written. Tables only: the rule itself is money.sql,
-- which `flask init-db` applies after the migrations; init-db then
-- recomputes the stored effects from the stored bytes (effect version 3).

-- What a payment's refunds and disputes take now. Every debit the previous
-- release made was by running total, so it is the highest total applied.
ALTER TABLE payments ADD COLUMN debited_cents BIGINT NOT NULL DEFAULT 0
    CHECK (debited_cents BETWEEN 0 AND amount_cents);
UPDATE payments SET debited_cents = refunded_cents WHERE refunded_cents <> 0;

CREATE TABLE movements (
    source       TEXT NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('refund', 'dispute')),
    movement_id  TEXT NOT NULL CHECK (char_length(movement_id) BETWEEN 1 AND 128),
    payment_id   TEXT NOT NULL,
    amount_cents BIGINT NOT NULL CHECK (amount_cents > 0),
    state        TEXT NOT NULL CHECK (state IN ('applied', 'reversed')),
    event_id     TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, kind, movement_id),
    FOREIGN KEY (source, payment_id) REFERENCES payments (source, payment_id)
);
CREATE INDEX movements_payment_idx ON movements (source, payment_id);

-- The journal names the movement, and money goes back as well as out.
ALTER TABLE ledger_journal ADD COLUMN movement_id TEXT;
ALTER TABLE ledger_journal DROP CONSTRAINT ledger_journal_kind_check;
ALTER TABLE ledger_journal ADD CONSTRAINT ledger_journal_kind_check
    CHECK (kind IN ('credit', 'refund_reversed', 'dispute_reinstated') AND amount_cents > 0
           OR kind IN ('refund', 'dispute_withdrawn') AND amount_cents < 0);

-- Rows keep the effect version they were hashed by; init-db recomputes them.
ALTER TABLE webhook_events ALTER COLUMN effect_version SET DEFAULT 3;
