-- The application's side: holds on a user's credit, giving a spend back,
-- and the application's own keys of its users.
--
-- Effect version 9: a payment whose user field (this service's data.userId,
-- PayPal's custom_id, Razorpay's notes.user_id) is not a UUID was refused,
-- its effect hashed as a refusal; it now names the user by the
-- application's key, and applies. `flask init-db` recomputes, after this,
-- the stored effects of rows of another version, so that the provider's
-- retry or `flask events replay` applies it.
--
-- user_keys: the application's own key of a user (an integer's digits, or
-- its text key), which a payment's metadata may name instead of the user's
-- UUID; apply_event reads it (ledger_delivery's new attribute app_key:
-- money.sql creates the type again, and the functions that take it).
--
-- holds: one row per hold the application places (money.sql's place_hold,
-- capture_hold, release_hold), keyed by the application's reference. A
-- small table of its own: nothing here rewrites a row of the journal.
--
-- ledger_journal: a new kind, 'give_back' (amount > 0: a spend given back,
-- naming the spend's reference), which the journal's two CHECKs allow as
-- migration 012 replaces them (it runs after this file, and replaces them
-- last). A give-back names the reference of the spend it gives back, so the
-- reference is unique per kind (one spend and one give-back of it), not
-- across the journal: the unique index is built again on (reference, kind).
-- Only spends have a reference, so the index is small, but building it
-- reads the journal once, while this transaction holds it (journal writes
-- wait for that read).
CREATE TABLE holds (
    reference      TEXT PRIMARY KEY CHECK (char_length(reference) BETWEEN 1 AND 128),
    user_id        UUID NOT NULL REFERENCES user_balances (user_id),
    amount_cents   BIGINT NOT NULL CHECK (amount_cents > 0),
    expires_at     TIMESTAMPTZ NOT NULL,
    state          TEXT NOT NULL DEFAULT 'held' CHECK (state IN ('held', 'captured', 'released')),
    captured_cents BIGINT CHECK (captured_cents BETWEEN 1 AND amount_cents),
    journal_id     BIGINT REFERENCES ledger_journal (id),
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    closed_at      TIMESTAMPTZ,
    CONSTRAINT holds_closed_check
        CHECK (CASE state
               WHEN 'held' THEN num_nonnulls(captured_cents, journal_id, closed_at) = 0
               WHEN 'captured' THEN num_nonnulls(captured_cents, journal_id, closed_at) = 3
               ELSE num_nonnulls(captured_cents, journal_id) = 0 AND closed_at IS NOT NULL
               END)
);
CREATE INDEX holds_held_idx ON holds (user_id) WHERE state = 'held';

DROP INDEX ledger_journal_reference_key;
CREATE UNIQUE INDEX ledger_journal_reference_key ON ledger_journal (reference, kind) WHERE reference IS NOT NULL;

ALTER TABLE webhook_events ALTER COLUMN effect_version SET DEFAULT 9;
CREATE TABLE user_keys (
    app_key    TEXT PRIMARY KEY CHECK (char_length(app_key) BETWEEN 1 AND 255),
    user_id    UUID NOT NULL UNIQUE REFERENCES user_balances (user_id),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
DROP TYPE IF EXISTS ledger_delivery CASCADE;  -- 005 dropped it already when both run
