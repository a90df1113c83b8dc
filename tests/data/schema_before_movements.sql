-- schema.sql as released before movements (commit 4de879c), with migrations 001-003: tests/test_db.py
-- creates a database with it (its apply_event included) and upgrades it. Kept as it was; never edit it.

-- webhook-ledger schema: the current one, whole; the file to read. Needs
-- PostgreSQL 14 or later (CREATE OR REPLACE TRIGGER).
--
-- `flask init-db` (app/schema.py) runs it on an empty database and records
-- every file of migrations/ as included. A database created earlier gets the
-- migrations it lacks instead, in order. So a change to the schema is made
-- twice: here, and in a new migrations/NNN_what.sql that takes a database at
-- the previous version to it (a migration, once released, never changes);
-- tests/test_db.py checks that both ways end in the same tables, constraints,
-- indexes and functions.

-- The ledger: one row per user, credited by payments and debited by their
-- refunds. The opening balance is the balance the row was created with (set
-- by the trigger below unless given), so that `flask ledger verify` can prove
-- balance = opening + the sum of the user's ledger_journal rows.
CREATE TABLE IF NOT EXISTS user_balances (
    user_id               UUID PRIMARY KEY,
    balance_cents         BIGINT NOT NULL DEFAULT 0,
    opening_balance_cents BIGINT NOT NULL,
    created_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at            TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One row per (source, provider event id), ever (until `flask events purge`
-- deletes it). The UNIQUE constraint on (source, event_id) is what the whole
-- design rests on: two deliveries of one event cannot both insert, whatever
-- Redis says; two sources may use the same id. A row is committed either
-- 'completed' (its effect committed in the same transaction) or 'failed' (no
-- effect; a later delivery of the same event, or `flask events replay`,
-- tries again). 'processing' is only ever seen inside the transaction that
-- inserted it.
CREATE TABLE IF NOT EXISTS webhook_events (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- 'default' for POST /api/webhooks, else a name from WEBHOOK_SOURCES.
    source           TEXT NOT NULL DEFAULT 'default' CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    event_id         TEXT NOT NULL CHECK (char_length(event_id) BETWEEN 1 AND 128),
    event_type       TEXT NOT NULL CHECK (char_length(event_type) BETWEEN 1 AND 64),
    status           TEXT NOT NULL DEFAULT 'processing'
                     CHECK (status IN ('processing', 'completed', 'failed')),
    -- The exact bytes received: the event of record, which replay and
    -- verify parse. NULL only on rows stored before the bytes were kept (by
    -- the release before sources; migrations/001 cannot make them up).
    body             BYTEA,
    -- The same body as jsonb, for querying only. NULL when the body holds a
    -- value jsonb cannot (\u0000, a lone surrogate escape, a number beyond
    -- numeric's range): such an event is stored and applied from its bytes
    -- all the same, and a sanitised copy would show values that were not sent.
    payload          JSONB,
    attempts         INTEGER NOT NULL DEFAULT 1 CHECK (attempts >= 1),
    last_error       TEXT,                    -- why the last attempt failed, while it is failed
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at     TIMESTAMPTZ,
    -- SHA-256 of body (of the bytes received, on rows stored before body).
    payload_sha256   BYTEA NOT NULL CHECK (octet_length(payload_sha256) = 32),
    -- SHA-256 of the event's effect (events.Event.effect_sha256): a later
    -- delivery of the id with another effect is refused (409
    -- payload_mismatch) and only counted; the same effect in other bytes is
    -- the same event. NULL only on rows stored before effects were kept
    -- (their bytes are compared), or whose stored bytes do not parse.
    effect_sha256    BYTEA CHECK (octet_length(effect_sha256) = 32),
    -- The rule that effect_sha256 was computed by: `flask init-db`
    -- recomputes, from the stored bytes, the effects of rows stored under an
    -- older rule (NULL: the first), so that re-deliveries compare alike.
    effect_version   SMALLINT DEFAULT 2,
    mismatches       INTEGER NOT NULL DEFAULT 0 CHECK (mismatches >= 0),
    last_mismatch_at TIMESTAMPTZ,
    CONSTRAINT webhook_events_source_event_id_key UNIQUE (source, event_id)
);

-- Operators look for failed events.
CREATE INDEX IF NOT EXISTS webhook_events_status_idx
    ON webhook_events (status) WHERE status <> 'completed';
-- `flask events list` shows the newest first; `flask events purge` deletes
-- the oldest completed ones in batches.
CREATE INDEX IF NOT EXISTS webhook_events_created_at_idx
    ON webhook_events (created_at);

-- One row per payment credited, per source. Its primary key is what
-- "a payment is credited at most once" rests on, as webhook_events' unique
-- constraint is for events: however many events announce one payment, in
-- whatever order or concurrency, one insert wins. refunded_cents is the
-- highest refunded total applied: a refund event debits only what it adds.
CREATE TABLE IF NOT EXISTS payments (
    source         TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    -- The provider's payment: a Stripe PaymentIntent's id, a payment's
    -- data.paymentId, or the id of the event that credited it.
    payment_id     TEXT NOT NULL CHECK (char_length(payment_id) BETWEEN 1 AND 128),
    user_id        UUID NOT NULL REFERENCES user_balances (user_id),
    amount_cents   BIGINT NOT NULL CHECK (amount_cents > 0),
    currency       TEXT NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    refunded_cents BIGINT NOT NULL DEFAULT 0 CHECK (refunded_cents BETWEEN 0 AND amount_cents),
    event_id       TEXT NOT NULL,             -- the event whose delivery credited it
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, payment_id)
);

-- The ledger's journal, append-only: one row per balance change, written in
-- the transaction that changes user_balances. A credit (amount > 0) names
-- the payment it credits, a refund (amount < 0) the payment it debits. It
-- outlives the webhook_events row (purge keeps it; hence no foreign key),
-- and its UNIQUE (source, event_id) (one balance change per event) stops an
-- event whose row was purged from being applied again, or marked failed,
-- if it is redelivered.
CREATE TABLE IF NOT EXISTS ledger_journal (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source       TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    event_id     TEXT NOT NULL CHECK (char_length(event_id) BETWEEN 1 AND 128),
    user_id      UUID NOT NULL REFERENCES user_balances (user_id),
    amount_cents BIGINT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    kind         TEXT NOT NULL,
    payment_id   TEXT NOT NULL CONSTRAINT ledger_journal_payment_id_check
                      CHECK (char_length(payment_id) BETWEEN 1 AND 128),
    CONSTRAINT ledger_journal_kind_check
        CHECK (kind = 'credit' AND amount_cents > 0 OR kind = 'refund' AND amount_cents < 0),
    CONSTRAINT ledger_journal_source_event_id_key UNIQUE (source, event_id)
);
CREATE INDEX IF NOT EXISTS ledger_journal_user_idx ON ledger_journal (user_id);

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

-- The money rule, written once: every delivery (new, retried, replayed) of
-- every event is recorded and applied by this one function, called in one
-- statement (app/ledger.py). The caller has parsed the bytes and checked what
-- it can without the database: p_problem is why the event cannot apply
-- (NULL: it can), p_kind what it does ('credit', 'refund', or NULL: nothing),
-- p_amount a credit's amount or a refund's total refunded so far, p_user a
-- credit's user (a refund's is its payment's). It returns the outcome
-- ('processed', 'duplicate', 'failed', 'payload_mismatch' or
-- 'payment_mismatch'), why it failed, the SHA-256 of the bytes stored before
-- this delivery (when the event was stored already), the balance change made
-- ('credit', 'refund', 'payment_duplicate': a credited payment announced
-- again, or NULL) and the balance it left.
--
-- Locks, always in this order, so that two deliveries never wait on each
-- other in a circle: the event's row (its insert, or FOR UPDATE), then for a
-- credit the user's row and the payment's key (an insert waits only for an
-- uncommitted insert of the same key, whose owner holds its own user's row
-- already), for a refund the payment's row and then its user's. A wait longer than lock_timeout ends the
-- statement with nothing committed (503, retried).
CREATE OR REPLACE FUNCTION apply_event(
    p_source text, p_event_id text, p_type text, p_body bytea, p_sha256 bytea, p_effect bytea,
    p_keep_json boolean, p_problem text, p_kind text, p_payment text, p_user uuid, p_amount bigint,
    p_currency text,
    OUT outcome text, OUT problem text, OUT stored_sha256 bytea, OUT change text, OUT balance_after bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_row_id bigint;
    v_status text;
    v_effect bytea;
    v_payment payments%ROWTYPE;
    v_mismatch boolean := false;
BEGIN
    -- Record: a new event is inserted already final when nothing is left to
    -- decide; a purged event that changed a balance is never inserted again.
    INSERT INTO webhook_events (source, event_id, event_type, body, payload, payload_sha256, effect_sha256,
                                status, completed_at, last_error)
    SELECT p_source, p_event_id, p_type, p_body,
           CASE WHEN p_keep_json THEN convert_from(p_body, 'UTF8')::jsonb END, p_sha256, p_effect,
           CASE WHEN p_problem IS NOT NULL THEN 'failed' WHEN p_kind IS NULL THEN 'completed' ELSE 'processing' END,
           CASE WHEN p_problem IS NULL AND p_kind IS NULL THEN now() END, p_problem
    WHERE NOT EXISTS (SELECT 1 FROM ledger_journal j WHERE j.source = p_source AND j.event_id = p_event_id)
    ON CONFLICT (source, event_id) DO NOTHING
    RETURNING id INTO v_row_id;

    IF v_row_id IS NULL THEN
        -- Stored before (or by a twin that just committed: the insert waited
        -- for it). FOR UPDATE serialises two retries of a failed event.
        SELECT e.id, e.status, e.payload_sha256, e.effect_sha256 INTO v_row_id, v_status, stored_sha256, v_effect
        FROM webhook_events e WHERE e.source = p_source AND e.event_id = p_event_id
        FOR UPDATE;
        IF NOT FOUND THEN
            IF EXISTS (SELECT 1 FROM ledger_journal j WHERE j.source = p_source AND j.event_id = p_event_id) THEN
                outcome := 'duplicate';  -- purged after it changed a balance: the journal says it is done
                RETURN;
            END IF;
            -- Purged while this delivery ran: the sender's retry will find out.
            RAISE EXCEPTION 'the event''s row was purged while this delivery ran'
                USING ERRCODE = 'serialization_failure';
        END IF;
        -- Rows stored before effects were kept are compared by their bytes.
        IF coalesce(v_effect <> p_effect, stored_sha256 <> p_sha256) THEN
            UPDATE webhook_events SET mismatches = mismatches + 1, last_mismatch_at = now() WHERE id = v_row_id;
            outcome := 'payload_mismatch';
            RETURN;
        END IF;
        IF v_status = 'completed' THEN
            outcome := 'duplicate';
            RETURN;
        END IF;
        -- A failed event, tried again from this delivery's bytes.
        UPDATE webhook_events
        SET attempts = attempts + 1, updated_at = now(), body = p_body, payload_sha256 = p_sha256,
            payload = CASE WHEN p_keep_json THEN convert_from(p_body, 'UTF8')::jsonb END, effect_sha256 = p_effect,
            effect_version = DEFAULT
        WHERE id = v_row_id;
    ELSIF p_problem IS NOT NULL THEN
        outcome := 'failed';
        problem := p_problem;
        RETURN;
    ELSIF p_kind IS NULL THEN
        outcome := 'processed';
        RETURN;
    END IF;

    -- Decide, and change the balance.
    problem := p_problem;
    IF problem IS NULL AND p_kind = 'credit' THEN
        -- Credit first (its row lock serialises the user's credits), then
        -- claim the payment's key: a twin announcing the same payment waits
        -- on that insert, then finds it taken and takes its credit back.
        UPDATE user_balances SET balance_cents = balance_cents + p_amount, updated_at = now()
        WHERE user_id = p_user AND balance_cents <= 9223372036854775807 - p_amount
        RETURNING user_balances.balance_cents INTO balance_after;
        IF FOUND THEN
            INSERT INTO payments (source, payment_id, user_id, amount_cents, currency, event_id)
            VALUES (p_source, p_payment, p_user, p_amount, p_currency, p_event_id)
            ON CONFLICT (source, payment_id) DO NOTHING;
            IF FOUND THEN
                INSERT INTO ledger_journal (source, event_id, kind, payment_id, user_id, amount_cents)
                VALUES (p_source, p_event_id, 'credit', p_payment, p_user, p_amount);
                change := 'credit';
            ELSE
                UPDATE user_balances SET balance_cents = balance_cents - p_amount WHERE user_id = p_user;
                balance_after := NULL;
            END IF;
        END IF;
        IF change IS NULL THEN
            SELECT * INTO v_payment FROM payments WHERE source = p_source AND payment_id = p_payment;
            IF NOT FOUND THEN
                problem := CASE WHEN EXISTS (SELECT 1 FROM user_balances WHERE user_id = p_user)
                                THEN 'credit would overflow the balance' ELSE 'unknown user ' || p_user END;
            ELSIF (v_payment.user_id, v_payment.amount_cents, v_payment.currency) = (p_user, p_amount, p_currency)
            THEN
                change := 'payment_duplicate';
            ELSE
                v_mismatch := true;
                problem := format('payment %s was credited by event %s with another user, amount or currency',
                                  p_payment, v_payment.event_id);
            END IF;
        END IF;
    ELSIF problem IS NULL AND p_kind = 'refund' THEN
        SELECT * INTO v_payment FROM payments WHERE source = p_source AND payment_id = p_payment FOR UPDATE;
        IF NOT FOUND THEN
            problem := 'unknown payment ' || p_payment;
        ELSIF v_payment.currency <> p_currency THEN
            problem := format('refund in %s of payment %s, which was in %s', p_currency, p_payment, v_payment.currency);
        ELSIF p_amount > v_payment.amount_cents THEN
            problem := format('refunded total of %s cents is above payment %s''s %s cents',
                              p_amount, p_payment, v_payment.amount_cents);
        ELSIF p_amount > v_payment.refunded_cents THEN
            -- Only what this total adds to the highest one applied so far.
            UPDATE payments SET refunded_cents = p_amount, updated_at = now()
            WHERE source = p_source AND payment_id = p_payment;
            UPDATE user_balances SET balance_cents = balance_cents - (p_amount - v_payment.refunded_cents),
                                     updated_at = now()
            WHERE user_id = v_payment.user_id RETURNING balance_cents INTO balance_after;
            INSERT INTO ledger_journal (source, event_id, kind, payment_id, user_id, amount_cents)
            VALUES (p_source, p_event_id, 'refund', p_payment, v_payment.user_id,
                    v_payment.refunded_cents - p_amount);
            change := 'refund';
        END IF;  -- else a total already applied (late, repeated, out of order): nothing to debit
    END IF;

    -- Complete, or record why not.
    IF problem IS NULL THEN
        UPDATE webhook_events SET status = 'completed', completed_at = now(), updated_at = now(), last_error = NULL
        WHERE id = v_row_id;
        outcome := CASE WHEN change = 'payment_duplicate' THEN 'duplicate' ELSE 'processed' END;
    ELSE
        UPDATE webhook_events SET status = 'failed', last_error = problem, updated_at = now() WHERE id = v_row_id;
        outcome := CASE WHEN v_mismatch THEN 'payment_mismatch' ELSE 'failed' END;
    END IF;
END
$$;
