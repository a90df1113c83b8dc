-- 1.0.0 -> the next release: the ledger's currency, recorded (schema.sql's
-- ledger_currency). init-db then records LEDGER_CURRENCY in it, refusing one
-- that a credited payment contradicts.
CREATE TABLE IF NOT EXISTS ledger_currency (
    one         BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    currency    TEXT NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
