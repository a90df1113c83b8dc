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
-- naming the spend's reference), so its two CHECKs are replaced under their
-- names, NOT VALID (no scan while this transaction holds the table; `flask
-- init-db` validates them after the commit, as 007's). A give-back names the
-- reference of the spend it gives back, so the reference is unique per kind
-- (one spend and one give-back of it), not across the journal: the unique
-- index is built again on (reference, kind). Only spends have a reference,
-- so the index is small, but building it reads the journal once, while
-- this transaction holds it (journal writes wait for that read).
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

ALTER TABLE ledger_journal
    DROP CONSTRAINT ledger_journal_kind_check,
    ADD CONSTRAINT ledger_journal_kind_check
        CHECK (kind IN ('credit', 'refund_reversed', 'dispute_reinstated', 'give_back') AND amount_cents > 0
               OR kind IN ('refund', 'dispute_withdrawn', 'spend') AND amount_cents < 0
               OR kind = 'adjustment' AND amount_cents <> 0) NOT VALID,
    DROP CONSTRAINT ledger_journal_names_check,
    ADD CONSTRAINT ledger_journal_names_check
        CHECK (CASE kind
               WHEN 'adjustment' THEN num_nonnulls(event_id, movement_id, reference) = 0
                                      AND num_nonnulls(source, payment_id) IN (0, 2) AND num_nonnulls(reason, actor) = 2
               WHEN 'spend' THEN num_nonnulls(source, event_id, payment_id, movement_id, reason, actor) = 0
                                 AND reference IS NOT NULL
               WHEN 'give_back' THEN num_nonnulls(source, event_id, payment_id, movement_id, reason, actor) = 0
                                     AND reference IS NOT NULL
               ELSE num_nonnulls(source, event_id, payment_id) = 3 AND num_nonnulls(reference, reason, actor) = 0
               END) NOT VALID;
DROP INDEX ledger_journal_reference_key;
CREATE UNIQUE INDEX ledger_journal_reference_key ON ledger_journal (reference, kind) WHERE reference IS NOT NULL;

ALTER TABLE webhook_events ALTER COLUMN effect_version SET DEFAULT 9;
CREATE TABLE user_keys (
    app_key    TEXT PRIMARY KEY CHECK (char_length(app_key) BETWEEN 1 AND 255),
    user_id    UUID NOT NULL UNIQUE REFERENCES user_balances (user_id),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
DROP TYPE IF EXISTS ledger_delivery CASCADE;  -- 005 dropped it already when both run
