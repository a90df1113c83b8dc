-- 006: journal rows that no event wrote: an operator's adjustment (`flask
-- ledger adjust`) and the application's spend (money.sql's `spend`). Takes a
-- database at the migrations before it to schema.sql as this migration was
-- written; it changes ledger_journal alone. Tables only: the functions are
-- money.sql's, which `flask init-db` applies after the migrations. Every row
-- already stored is an event's, and keeps its source, event and payment: the
-- new checks hold for it as it is. Adding the checks and the unique key reads
-- the journal once, holding its lock: on a big journal, run `flask init-db`
-- while deliveries are paused (they answer 503 and are retried).
ALTER TABLE ledger_journal
    ALTER COLUMN source DROP NOT NULL,
    ALTER COLUMN event_id DROP NOT NULL,
    ALTER COLUMN payment_id DROP NOT NULL,
    ADD COLUMN reference TEXT CHECK (char_length(reference) BETWEEN 1 AND 128),
    ADD COLUMN reason TEXT CHECK (reason ~ '\S' AND char_length(reason) <= 500),
    ADD COLUMN actor TEXT CHECK (char_length(actor) BETWEEN 1 AND 128),
    DROP CONSTRAINT ledger_journal_kind_check,
    ADD CONSTRAINT ledger_journal_kind_check
        CHECK (kind IN ('credit', 'refund_reversed', 'dispute_reinstated') AND amount_cents > 0
               OR kind IN ('refund', 'dispute_withdrawn', 'spend') AND amount_cents < 0
               OR kind = 'adjustment' AND amount_cents <> 0),
    ADD CONSTRAINT ledger_journal_names_check
        CHECK (CASE kind
               WHEN 'adjustment' THEN num_nonnulls(event_id, movement_id, reference) = 0
                                      AND num_nonnulls(source, payment_id) IN (0, 2) AND num_nonnulls(reason, actor) = 2
               WHEN 'spend' THEN num_nonnulls(source, event_id, payment_id, movement_id, reason, actor) = 0
                                 AND reference IS NOT NULL
               ELSE num_nonnulls(source, event_id, payment_id) = 3 AND num_nonnulls(reference, reason, actor) = 0
               END);
-- Spends only (only a spend names a reference): an event's row costs it nothing.
CREATE UNIQUE INDEX ledger_journal_reference_key ON ledger_journal (reference) WHERE reference IS NOT NULL;
