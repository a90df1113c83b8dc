-- 008: users linked to a provider's customers, events that are not ours,
-- failed events dismissed. Tables only: money.sql's apply_event gains
-- p_customer, p_user_key and p_no_user, which it records here. Effect
-- version 5 hashes a PaymentIntent's metadata whole and its customer (which
-- key names the user is a setting): init-db recomputes the stored effects.

-- A provider's customer -> the user its payments credit when their metadata
-- names none (`flask users link`). Never changed nor deleted once made: a
-- credit made through a link is checked against it by `flask ledger verify`.
CREATE TABLE customer_links (
    source      TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    customer_id TEXT NOT NULL CHECK (char_length(customer_id) BETWEEN 1 AND 128),
    user_id     UUID NOT NULL REFERENCES user_balances (user_id),
    linked_by   TEXT NOT NULL CHECK (char_length(linked_by) BETWEEN 1 AND 128),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, customer_id)
);
CREATE INDEX customer_links_user_idx ON customer_links (user_id);

-- The customer whose link named the payment's user; NULL: its metadata did.
ALTER TABLE payments ADD COLUMN customer_id TEXT;

-- Payments that named no user (no metadata, no linked customer) under a
-- source's `ignore`: their refunds and disputes are ignored too.
CREATE TABLE ignored_payments (
    source     TEXT NOT NULL,
    payment_id TEXT NOT NULL,
    event_id   TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, payment_id)
);

ALTER TABLE webhook_events DROP CONSTRAINT webhook_events_status_check;
ALTER TABLE webhook_events ADD CONSTRAINT webhook_events_status_check
    CHECK (status IN ('processing', 'completed', 'failed', 'ignored', 'dismissed'));
ALTER TABLE webhook_events ADD COLUMN user_metadata_key TEXT;
ALTER TABLE webhook_events ADD COLUMN no_user TEXT;
ALTER TABLE webhook_events ADD COLUMN dismissed_reason TEXT
    CHECK (dismissed_reason ~ '\S' AND char_length(dismissed_reason) <= 500);
ALTER TABLE webhook_events ADD COLUMN dismissed_by TEXT CHECK (char_length(dismissed_by) BETWEEN 1 AND 128);
ALTER TABLE webhook_events ADD COLUMN dismissed_at TIMESTAMPTZ;
ALTER TABLE webhook_events ALTER COLUMN effect_version SET DEFAULT 5;
