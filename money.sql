-- The money rule, written once. `flask init-db` applies this whole file after
-- schema.sql or the migrations, every time (a repeatable step, in the same
-- transaction, under the same lock), so a change to the rule is one diff
-- here; migrations change tables only. Everything in it is CREATE OR
-- REPLACE, or dropped and created again: safe to apply twice. A function
-- whose OUT parameters change must be dropped first (CREATE OR REPLACE
-- cannot change them). tests/test_money.py holds the literals below to the
-- Python enums (app/intake/events.py, app/store/ledger.py, app/receiver/delivery.py).
--
-- The rule (docs/design.md, "Payments and movements"), per payment:
--   credit   once per (source, payment): its amount, to its user.
--   refunds  once per (source, 'refund', refund id): a refund object takes
--            its amount when first seen counted, and gives it back when
--            first seen failed or canceled ('applied', then 'reversed').
--   totals   the highest running total seen (payments.refunded_cents)
--            takes whatever it says beyond the refund objects known, in any
--            state: one refund announced both ways takes its amount once.
--   disputes once per (source, 'dispute', dispute id): the funds withdrawn
--            are taken, the funds reinstated given back.
--   due      = least(credited, refunds applied + greatest(0, highest total
--            - refunds known) + disputes withdrawn and not reinstated).
-- Each of these only grows with the set of events received (a total, a
-- movement's state), so `due` depends on that set, never on its order; each
-- event moves the balance by what it changes `due` by, in one journal row.
--
-- Besides events, two functions at the end move a balance, each in one
-- journal row of its own: `adjust` (an operator's correction, `flask ledger
-- adjust`) and `spend` (the application spends a user's credit, once per
-- reference it gives).

DROP VIEW IF EXISTS payment_accounts;
DROP VIEW IF EXISTS ledger_journal_keyed;
-- Each journal row under its payment's and movement's keys as they are now:
-- a row of a key that a later 'payment_moved' row moved (p_payment to
-- acct_X/p_payment: `flask payments move-to-account`, migration 005) is
-- read under the key in the account; the row itself keeps the key it was
-- written with (the journal is append-only, and its feed gives each row
-- once). `flask ledger verify` reads the journal through it.
CREATE VIEW ledger_journal_keyed AS
SELECT
    j.id,
    j.source,
    j.event_id,
    j.user_id,
    j.amount_cents,
    j.created_at,
    j.kind,
    j.reference,
    j.reason,
    j.actor,
    j.moved_from,
    j.xid,
    coalesce(m.payment_id, j.payment_id) AS payment_id,
    CASE
        WHEN m.payment_id IS NULL OR j.movement_id IS NULL THEN j.movement_id
        ELSE split_part(m.payment_id, '/', 1) || '/' || j.movement_id
    END AS movement_id
FROM ledger_journal AS j
-- The move of the row's key after it, if any (a key is moved once at most:
-- ledger_journal_moved_from_key), joined by hash to the moves alone.
LEFT JOIN ledger_journal AS m
    ON
        m.moved_from IS NOT NULL AND j.payment_id = m.moved_from AND j.source = m.source AND j.id < m.id
        AND j.kind <> 'payment_moved';
-- Each payment's account: what was credited, what its refunds (by object and
-- by running total) and disputes took and gave back, what is due and what is
-- debited. apply_event moves the balance to `debit_due_cents`; `flask ledger
-- verify` checks that `debited_cents` equals it and the journal.
CREATE VIEW payment_accounts AS
SELECT
    p.source,
    p.payment_id,
    p.user_id,
    p.currency,
    p.amount_cents AS credited_cents,
    p.refunded_cents AS refunded_total_cents,
    m.refunds_known_cents,
    m.refunds_applied_cents,
    m.refunds_reversed_cents,
    m.disputes_withdrawn_cents,
    m.disputes_reinstated_cents,
    p.debited_cents,
    least(p.amount_cents, m.refunds_applied_cents + greatest(0, p.refunded_cents - m.refunds_known_cents)
                          + m.disputes_withdrawn_cents) AS debit_due_cents
FROM payments AS p
CROSS JOIN LATERAL (
    SELECT
        coalesce(sum(mv.amount_cents) FILTER (WHERE mv.kind = 'refund'), 0) AS refunds_known_cents,
        coalesce(sum(mv.amount_cents) FILTER (WHERE mv.kind = 'refund' AND mv.state = 'applied'), 0)
            AS refunds_applied_cents,
        coalesce(sum(mv.amount_cents) FILTER (WHERE mv.kind = 'refund' AND mv.state = 'reversed'), 0)
            AS refunds_reversed_cents,
        coalesce(sum(mv.amount_cents) FILTER (WHERE mv.kind = 'dispute' AND mv.state = 'applied'), 0)
            AS disputes_withdrawn_cents,
        coalesce(sum(mv.amount_cents) FILTER (WHERE mv.kind = 'dispute' AND mv.state = 'reversed'), 0)
            AS disputes_reinstated_cents
    FROM movements AS mv
    WHERE mv.source = p.source AND mv.payment_id = p.payment_id
) AS m;

-- What a caller decided of one delivery, without the database: apply_event's
-- input (app/store/ledger.py builds it; docs/design.md, "The money rule").
--   source, event_id, type, body, sha256 (of body), effect (the effect's
--       SHA-256, app/core/vocabulary.py): the event and its bytes of record;
--   problem: why it cannot apply (NULL: it can);
--   kind: what it moves, 'credit', 'refunded_total', 'refund', 'dispute',
--       'link' (no money: a customer linked to user_id, link_session), or
--       NULL (nothing); payment: its payment; amount: a credit's amount,
--       a running total, or a movement's amount; currency;
--   user_id: a credit's user (every other movement's is its payment's);
--       customer: the provider's customer, whose link names the user when
--       user_id is NULL; account: a Stripe Connect event's connected
--       account (acct_...), whose link names it when the customer's does
--       not (payment, movement and customer are then keys in it:
--       acct_X/pi_Y, acct_X/re_Y, acct_X/cus_Y);
--   movement: a refund's or a dispute's id; state: what the event says of
--       it, 'applied' or 'reversed';
--   ledger_currency, test_events, user_key, no_user: the settings decided
--       under (LEDGER_CURRENCY, STRIPE_ACCEPT_TEST_EVENTS, the source's
--       WEBHOOK_<NAME>_USER_METADATA_KEY and _NO_USER, 'refuse' or
--       'ignore'), recorded with the event for `flask ledger verify`;
--   origin: 'delivery' or 'reconcile'; NULL, a replay of the stored bytes,
--       keeps the row's;
--   app_key: a credit's or a link's user named by the application's own key
--       of it (user_keys) instead of user_id.
-- A type is not replaced like a function: a change to its attributes is a
-- DROP TYPE ... CASCADE in a migration, then this file creates it again.
-- The rule as the commit tagged 1.0.0 made it took the delivery as 20
-- scalars: a database that commit made keeps that function beside this
-- one unless it is dropped (nothing calls it; it keys a connected account's
-- money bare).
DROP FUNCTION IF EXISTS apply_event(
    text, text, text, bytea, bytea, bytea, text, text, text, uuid, bigint, text, text, text, text, boolean, text,
    text, text, text
);
DO $$
BEGIN
    IF to_regtype('ledger_delivery') IS NULL THEN
        CREATE TYPE ledger_delivery AS (
            source text, event_id text, type text, body bytea, sha256 bytea, effect bytea, problem text,
            kind text, payment text, user_id uuid, amount bigint, currency text, movement text, state text,
            ledger_currency text, test_events boolean, origin text, customer text, user_key text, no_user text,
            account text, app_key text);
    END IF;
END
$$;

-- Every delivery (new, retried, replayed, reconciled) of every event is
-- recorded and applied by apply_event, in one statement: record the event,
-- then credit its payment or move its payment's balance (each journaling
-- what it changed), then complete it. It returns the outcome ('processed',
-- 'duplicate', 'failed', 'ignored', 'payload_mismatch' or
-- 'payment_mismatch'), why it failed (or, for 'payment_user_disagreed',
-- what disagreed), the SHA-256 of the bytes stored before this delivery
-- (when the event was stored already), the balance change made ('credit',
-- 'refund', 'refund_reversed', 'dispute_withdrawn', 'dispute_reinstated',
-- 'payment_duplicate': a credited payment announced again,
-- 'payment_user_disagreed': announced again naming another user, or NULL)
-- and the balance it left.
--
-- Locks, always in this order, so that two deliveries never wait on each
-- other in a circle: the event's row (its insert, or FOR UPDATE), then the
-- payment's row (a credit's insert of its key, any other movement's FOR
-- UPDATE, which serialises every movement of one payment), then the
-- movement's row, then the user's row. A wait longer than lock_timeout ends
-- the statement with nothing committed (503, retried).
CREATE OR REPLACE FUNCTION apply_event(d ledger_delivery,
    OUT outcome text, OUT problem text, OUT stored_sha256 bytea, OUT change text, OUT balance_after bigint)
LANGUAGE plpgsql AS $$
DECLARE
    -- Each step's OUT parameters, assigned (a simple expression, not a
    -- query: the cheaper call in PL/pgSQL).
    r record;
    m record;
    v_moved boolean := false;
BEGIN
    r := record_event(d);
    outcome := r.outcome;
    problem := r.problem;
    stored_sha256 := r.stored_sha256;
    IF outcome IS NOT NULL THEN
        RETURN;
    END IF;
    IF problem IS NULL AND d.kind = 'credit' THEN
        m := credit_payment(d);
        v_moved := true;
    ELSIF problem IS NULL AND d.kind = 'link' THEN
        m := link_session(d);
        v_moved := true;
    ELSIF problem IS NULL AND d.kind IS NOT NULL THEN
        BEGIN  -- a subtransaction: a balance that cannot hold the debit or the reversal undoes the movement's change
            m := move_payment(d);
            v_moved := true;
        EXCEPTION WHEN numeric_value_out_of_range THEN
            problem := SQLERRM;
        END;
    END IF;
    IF NOT v_moved THEN
        outcome := complete_event(r.row_id, r.is_new, problem, false, false, NULL);
        RETURN;
    END IF;
    change := m.change;
    balance_after := m.balance_after;
    problem := m.problem;
    outcome := complete_event(r.row_id, r.is_new, problem, m.ignored, m.mismatch, change);
END
$$;

-- Record: a new event is inserted as it will most likely end, completed
-- unless its problem is known, so that its row is written once; the rare
-- decision that fails it later writes it again. A purged event that changed
-- a balance is never inserted again. An event stored before ends here
-- (outcome set) unless it is failed: then it is tried again from this
-- delivery's bytes. A new event ends here too when it is failed or moves
-- nothing. problem: the delivery's, for the steps after.
CREATE OR REPLACE FUNCTION record_event(d ledger_delivery, OUT row_id bigint, OUT is_new boolean,
    OUT outcome text, OUT problem text, OUT stored_sha256 bytea)
LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
    v_effect bytea;
BEGIN
    problem := d.problem;
    INSERT INTO webhook_events (source, event_id, event_type, body, payload_sha256, effect_sha256,
                                status, completed_at, last_error, ledger_currency, test_events_accepted, origin,
                                user_metadata_key, no_user)
    SELECT d.source, d.event_id, d.type, d.body, d.sha256, d.effect,
           CASE WHEN d.problem IS NOT NULL THEN 'failed' ELSE 'completed' END,
           CASE WHEN d.problem IS NULL THEN now() END, d.problem, d.ledger_currency, d.test_events,
           coalesce(d.origin, 'delivery'), d.user_key, d.no_user
    WHERE NOT EXISTS (SELECT 1 FROM ledger_journal j WHERE j.source = d.source AND j.event_id = d.event_id)
    ON CONFLICT (source, event_id) DO NOTHING
    RETURNING id INTO row_id;
    is_new := row_id IS NOT NULL;
    IF is_new THEN
        IF d.problem IS NOT NULL THEN
            outcome := 'failed';
        ELSIF d.kind IS NULL THEN
            outcome := 'processed';
        END IF;
        RETURN;
    END IF;

    -- Stored before (or by a twin that just committed: the insert waited
    -- for it). FOR UPDATE serialises two retries of a failed event.
    SELECT e.id, e.status, e.payload_sha256, e.effect_sha256 INTO row_id, v_status, stored_sha256, v_effect
    FROM webhook_events e WHERE e.source = d.source AND e.event_id = d.event_id
    FOR UPDATE;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM ledger_journal j WHERE j.source = d.source AND j.event_id = d.event_id) THEN
            outcome := 'duplicate';  -- purged after it changed a balance: the journal says it is done
            problem := NULL;
            RETURN;
        END IF;
        -- Purged while this delivery ran: the sender's retry will find out.
        RAISE EXCEPTION 'the event''s row was purged while this delivery ran'
            USING ERRCODE = 'serialization_failure';
    END IF;
    -- A row whose stored bytes do not parse (no effect) is compared by its
    -- bytes. A failed event whose provider had no record of it (its effect
    -- all zeros, app/providers/) takes whatever effect the provider has now:
    -- a body forged under a genuine event's id cannot hold the id.
    IF coalesce(v_effect <> d.effect, stored_sha256 <> d.sha256)
       AND NOT (v_status = 'failed' AND v_effect = decode(repeat('00', 32), 'hex')) THEN
        UPDATE webhook_events SET mismatches = mismatches + 1, last_mismatch_at = now() WHERE id = row_id;
        outcome := 'payload_mismatch';
        problem := NULL;
        RETURN;
    END IF;
    IF v_status = 'completed' THEN
        outcome := 'duplicate';
        problem := NULL;
        RETURN;
    ELSIF (v_status = 'ignored' OR v_status = 'dismissed') AND d.origin IS NOT NULL THEN
        outcome := 'ignored';  -- closed: only an operator's replay opens it again
        problem := 'the event is ' || v_status;
        RETURN;
    END IF;
    -- A failed event, tried again from this delivery's bytes (and type:
    -- another only when the provider had no record of it before).
    UPDATE webhook_events
    SET attempts = attempts + 1, updated_at = now(), event_type = d.type, body = d.body, payload_sha256 = d.sha256,
        effect_sha256 = d.effect, effect_version = DEFAULT, ledger_currency = d.ledger_currency,
        test_events_accepted = d.test_events, origin = coalesce(d.origin, origin), user_metadata_key = d.user_key,
        no_user = d.no_user
    WHERE id = row_id;
END
$$;

-- Whether an event of this type is read from its object as the provider
-- has it when fetched, not as it was when the event happened: Stripe's thin
-- events of API v1 resources, 'v1.' and their snapshot twin's type
-- (docs/providers/stripe.md, "Thin events"). Its metadata may have changed since.
-- tests/store/test_money_sql.py holds it to the registry's rules read when fetched (events.read_when_fetched).
CREATE OR REPLACE FUNCTION read_when_fetched(p_type text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_type LIKE 'v1.%'
$$;

-- A credit: its user (the event's, or its customer's link, or, when
-- neither names one, the user the payment was credited to already, or its
-- connected account's link, or the one an operator assigned to it:
-- payment_users), then the payment's key, then the user's balance and the
-- journal; payments.customer_id records the customer (or account) whose
-- link named the user. A payment named again with the same user, amount
-- and currency is a 'payment_duplicate'; with another user, by a twin of
-- which one is read when fetched, a 'payment_user_disagreed' (a duplicate,
-- its note in problem); otherwise a mismatch. ignored: no user, under the
-- source's 'ignore'.
CREATE OR REPLACE FUNCTION credit_payment(d ledger_delivery, OUT change text, OUT balance_after bigint,
    OUT problem text, OUT ignored boolean, OUT mismatch boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_user uuid := d.user_id;
    v_link text;  -- the customer, or the account, whose link named the user
    v_payment payments%ROWTYPE;
BEGIN
    ignored := false;
    mismatch := false;
    IF d.app_key IS NOT NULL THEN
        v_user := user_of_key(d.app_key);
        IF v_user IS NULL THEN
            problem := format('no user has the application''s key %s (add_user_key adds it)', d.app_key);
            RETURN;
        END IF;
    END IF;
    IF v_user IS NULL THEN
        -- The link is read, not locked: links are never changed nor deleted.
        SELECT l.user_id, l.customer_id INTO v_user, v_link FROM customer_links l
        WHERE l.source = d.source AND l.customer_id = d.customer;
        IF v_user IS NULL AND d.account IS NOT NULL THEN
            -- A connected account's customer linked bare under 1.0, which
            -- read that link in every account: migration 005 linked it in
            -- its account when a stored event named the account, and when
            -- none did (purged), this reads it as 1.0 did. Only a link
            -- made before 005 ran: a later bare link is the platform's.
            SELECT l.user_id, l.customer_id INTO v_user, v_link FROM customer_links l
            WHERE l.source = d.source AND l.customer_id = substr(d.customer, char_length(d.account) + 2)
                AND d.customer = d.account || '/' || l.customer_id
                AND l.created_at < (SELECT m.applied_at FROM schema_migrations m
                                    WHERE m.name = '005_connect_accounts.sql' AND m.ran);
        END IF;
        IF v_user IS NULL THEN
            -- A payment credited already (by another event that named its
            -- user: a Checkout Session) is this event's too: a duplicate.
            -- Else its connected account's link (the account's whole
            -- money: read after the payment's own user, which it must not
            -- contradict), else the user an operator assigned to the payment.
            SELECT p.user_id INTO v_user FROM payments p WHERE p.source = d.source AND p.payment_id = d.payment;
            IF v_user IS NULL AND d.account IS NOT NULL THEN
                SELECT l.user_id, l.customer_id INTO v_user, v_link FROM customer_links l
                WHERE l.source = d.source AND l.customer_id = d.account;
            END IF;
            IF v_user IS NULL THEN
                SELECT a.user_id INTO v_user FROM payment_users a
                WHERE a.source = d.source AND a.payment_id = d.payment;
            END IF;
        END IF;
        IF v_user IS NULL THEN
            problem := format('no user: no data.object.metadata.%s%s, and %s', coalesce(d.user_key, 'user_id'),
                              CASE WHEN d.type LIKE 'checkout.session.%' OR d.type LIKE 'v1.checkout.session.%'
                                   THEN ' nor data.object.client_reference_id'
                                   ELSE '' END,
                              CASE WHEN d.customer IS NULL THEN 'no data.object.customer'
                                   ELSE format('customer %s is linked to no user (flask users link %s %s USER_ID)',
                                               d.customer, d.source, d.customer) END)
                       || CASE WHEN d.account IS NULL THEN ''
                               ELSE format(', and account %s is linked to no user (flask users link %s %s USER_ID)',
                                           d.account, d.source, d.account) END;
            IF d.no_user = 'ignore' THEN
                ignored := true;
                INSERT INTO ignored_payments (source, payment_id, event_id) VALUES (d.source, d.payment, d.event_id)
                ON CONFLICT (source, payment_id) DO NOTHING;
            END IF;
            RETURN;
        END IF;
    END IF;
    -- The payment's key first: a twin announcing the same payment waits on
    -- this insert, then finds it taken. Then the user's row.
    INSERT INTO payments (source, payment_id, user_id, amount_cents, currency, event_id, customer_id)
    SELECT d.source, d.payment, v_user, d.amount, d.currency, d.event_id, v_link
    WHERE EXISTS (SELECT 1 FROM user_balances WHERE user_id = v_user)
    ON CONFLICT (source, payment_id) DO NOTHING;
    IF FOUND THEN
        UPDATE user_balances SET balance_cents = balance_cents + d.amount, updated_at = now()
        WHERE user_id = v_user AND balance_cents <= 9223372036854775807 - d.amount
        RETURNING user_balances.balance_cents INTO balance_after;
        IF FOUND THEN
            INSERT INTO ledger_journal (source, event_id, kind, payment_id, user_id, amount_cents)
            VALUES (d.source, d.event_id, 'credit', d.payment, v_user, d.amount);
            DELETE FROM ignored_payments WHERE source = d.source AND payment_id = d.payment;
            change := 'credit';
        ELSE
            DELETE FROM payments WHERE source = d.source AND payment_id = d.payment;
            problem := 'credit would overflow the balance';
        END IF;
        RETURN;
    END IF;
    SELECT * INTO v_payment FROM payments WHERE source = d.source AND payment_id = d.payment;
    IF NOT FOUND THEN
        problem := 'unknown user ' || v_user;
    ELSIF (v_payment.user_id, v_payment.amount_cents, v_payment.currency) = (v_user, d.amount, d.currency) THEN
        change := 'payment_duplicate';
    ELSIF (v_payment.amount_cents, v_payment.currency) = (d.amount, d.currency)
          AND (read_when_fetched(d.type) OR EXISTS (
                SELECT 1 FROM webhook_events e
                WHERE e.source = d.source AND e.event_id = v_payment.event_id AND read_when_fetched(e.event_type))) THEN
        -- One payment's twins, one read as its object is now: metadata
        -- changed after the payment succeeded. The first credit is final;
        -- this one is a duplicate whose disagreement is logged and counted
        -- (its note in problem), never a 409 retried for ever.
        change := 'payment_user_disagreed';
        problem := format('payment %s was credited to user %s by event %s; event %s names user %s: the first '
                          'credit stands', d.payment, v_payment.user_id, v_payment.event_id, d.event_id, v_user);
    ELSE
        mismatch := true;
        problem := format('payment %s was credited by event %s with another user, amount or currency',
                          d.payment, v_payment.event_id);
    END IF;
END
$$;

-- A link (a subscription's Checkout Session): the customer linked to the
-- user the event names, as `flask users link` links it (link_customer), by
-- the event; no money. Linked already to that user: nothing to do. A link is
-- never changed: linked to another user, or the user unknown, it is refused
-- (failed, 422), naming both users. Locks the link's key only, after the
-- event's row: no balance, no payment.
CREATE OR REPLACE FUNCTION link_session(d ledger_delivery, OUT change text, OUT balance_after bigint,
    OUT problem text, OUT ignored boolean, OUT mismatch boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_link customer_links%ROWTYPE;
    v_user uuid := coalesce(d.user_id, user_of_key(d.app_key));
BEGIN
    ignored := false;
    mismatch := false;
    IF v_user IS NULL THEN
        problem := format('no user has the application''s key %s (add_user_key adds it)', d.app_key);
        RETURN;
    END IF;
    IF link_customer(p_source => d.source, p_customer => d.customer, p_user => v_user,
                     p_by => left('event ' || d.event_id, 128)) IS NOT NULL THEN
        RETURN;
    END IF;
    SELECT * INTO v_link FROM customer_links l WHERE l.source = d.source AND l.customer_id = d.customer;
    IF NOT FOUND THEN
        problem := 'unknown user ' || v_user;
    ELSIF v_link.user_id <> v_user THEN
        problem := format('customer %s is linked to user %s (by %s, %s); this Session names user %s: '
                          'a link is never changed', d.customer, v_link.user_id, v_link.linked_by,
                          to_char(v_link.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS "UTC"'), v_user);
    END IF;
END
$$;

-- A movement of a credited payment (a refund object, a dispute, a running
-- total): the payment's row, locked, serialises them all. The movement is
-- recorded (or moved forward: 'applied' then 'reversed'), then the balance
-- moved by what that changed the payment's due by (debit_payment).
CREATE OR REPLACE FUNCTION move_payment(d ledger_delivery, OUT change text, OUT balance_after bigint,
    OUT problem text, OUT ignored boolean, OUT mismatch boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_payment payments%ROWTYPE;
    v_movement movements%ROWTYPE;
    m record;
BEGIN
    ignored := false;
    mismatch := false;
    SELECT * INTO v_payment FROM payments WHERE source = d.source AND payment_id = d.payment FOR UPDATE;
    IF NOT FOUND THEN
        problem := 'unknown payment ' || d.payment;
        IF EXISTS (SELECT 1 FROM ignored_payments i WHERE i.source = d.source AND i.payment_id = d.payment) THEN
            ignored := true;  -- a payment that is not ours: nobody's to debit
            problem := format('payment %s is not ours: it named no user, and was ignored', d.payment);
        ELSIF d.account IS NOT NULL AND EXISTS (
                SELECT 1 FROM payments p
                WHERE p.source = d.source AND p.payment_id = substr(d.payment, char_length(d.account) + 2)) THEN
            -- A connected account's payment keyed in no account (its events purged before migration 005 could
            -- read its account): a refusal, never a delivery that applies, pays for this lookup.
            problem := format('%s; payment %s is keyed in no account: if it is %s''s, flask payments '
                              'move-to-account %s %s %s moves it there', problem,
                              substr(d.payment, char_length(d.account) + 2), d.account, d.source,
                              substr(d.payment, char_length(d.account) + 2), d.account);
        END IF;
        RETURN;
    ELSIF v_payment.currency <> d.currency THEN
        problem := format('%s in %s of payment %s, which was in %s', CASE d.kind WHEN 'dispute' THEN 'dispute'
                          ELSE 'refund' END, d.currency, d.payment, v_payment.currency);
        RETURN;
    ELSIF d.amount > v_payment.amount_cents AND d.kind <> 'dispute' THEN
        -- A dispute's amount may differ from the payment's (a currency
        -- conversion): it is recorded as announced, and the rule's cap takes
        -- the whole payment at most. A refund never exceeds its payment.
        problem := CASE WHEN d.kind = 'refunded_total'
                        THEN format('refunded total of %s cents is above payment %s''s %s cents',
                                    d.amount, d.payment, v_payment.amount_cents)
                        ELSE format('%s %s of %s cents is above payment %s''s %s cents',
                                    d.kind, d.movement, d.amount, d.payment, v_payment.amount_cents) END;
        RETURN;
    END IF;
    IF d.kind = 'refunded_total' THEN
        IF d.amount > v_payment.refunded_cents THEN
            UPDATE payments SET refunded_cents = d.amount WHERE source = d.source AND payment_id = d.payment;
        END IF;  -- else a total already seen (late, repeated, out of order)
    ELSE
        INSERT INTO movements (source, kind, movement_id, payment_id, amount_cents, state, event_id)
        VALUES (d.source, d.kind, d.movement, d.payment, d.amount, d.state, d.event_id)
        ON CONFLICT (source, kind, movement_id) DO NOTHING;
        IF NOT FOUND THEN
            SELECT * INTO v_movement FROM movements
            WHERE source = d.source AND kind = d.kind AND movement_id = d.movement FOR UPDATE;
            IF (v_movement.payment_id, v_movement.amount_cents) <> (d.payment, d.amount) THEN
                mismatch := true;
                problem := format('%s %s was announced by event %s with another payment or amount',
                                  d.kind, d.movement, v_movement.event_id);
                RETURN;
            ELSIF v_movement.state = 'applied' AND d.state = 'reversed' THEN
                UPDATE movements SET state = 'reversed', updated_at = now()
                WHERE source = d.source AND kind = d.kind AND movement_id = d.movement;
            END IF;  -- else seen in this state, or a later one, already
        END IF;
    END IF;
    m := debit_payment(d, v_payment);
    change := m.change;
    balance_after := m.balance_after;
END
$$;

-- Move the balance of payment p's user by what its due changed by
-- (payment_accounts), in one journal row named by what the event says;
-- nothing when it did not change. The journal's CHECK refuses a sign
-- that disagrees (the rule only grows `due` for an applied movement or a
-- total, only shrinks it for a reversal).
CREATE OR REPLACE FUNCTION debit_payment(d ledger_delivery, p payments, OUT change text, OUT balance_after bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_due bigint;
BEGIN
    SELECT a.debit_due_cents INTO v_due FROM payment_accounts a WHERE a.source = d.source AND a.payment_id = d.payment;
    IF v_due = p.debited_cents THEN
        RETURN;
    END IF;
    change := CASE WHEN d.kind = 'dispute' AND d.state = 'applied' THEN 'dispute_withdrawn'
                   WHEN d.kind = 'dispute' THEN 'dispute_reinstated'
                   WHEN d.state = 'reversed' THEN 'refund_reversed'
                   ELSE 'refund' END;
    -- A balance that cannot hold the change is raised, and apply_event undoes the movement: a reversal adds to
    -- the balance, a debit takes from it.
    IF v_due < p.debited_cents AND (SELECT u.balance_cents FROM user_balances AS u WHERE u.user_id = p.user_id)
       > 9223372036854775807 - (p.debited_cents - v_due) THEN
        RAISE EXCEPTION '% of % cents would take the balance of user % past 9223372036854775807 cents',
            change, p.debited_cents - v_due, p.user_id USING ERRCODE = 'numeric_value_out_of_range';
    ELSIF v_due > p.debited_cents AND (SELECT u.balance_cents FROM user_balances AS u WHERE u.user_id = p.user_id)
          < -9223372036854775808 + (v_due - p.debited_cents) THEN
        RAISE EXCEPTION '% of % cents would take the balance of user % below -9223372036854775808 cents',
            change, v_due - p.debited_cents, p.user_id USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    UPDATE payments SET debited_cents = v_due, updated_at = now() WHERE source = d.source AND payment_id = d.payment;
    UPDATE user_balances SET balance_cents = balance_cents - (v_due - p.debited_cents), updated_at = now()
    WHERE user_id = p.user_id RETURNING balance_cents INTO balance_after;
    INSERT INTO ledger_journal (source, event_id, kind, payment_id, movement_id, user_id, amount_cents)
    VALUES (d.source, d.event_id, change, d.payment, d.movement, p.user_id, p.debited_cents - v_due);
END
$$;

-- Complete the event's row, or record why not: its outcome. A new event
-- was inserted completed, so only a failed one's retry is written here.
CREATE OR REPLACE FUNCTION complete_event(p_row_id bigint, p_new boolean, problem text, ignored boolean,
                                          mismatch boolean, change text, OUT outcome text)
LANGUAGE plpgsql AS $$
BEGIN
    IF problem IS NULL OR change = 'payment_user_disagreed' THEN  -- applied (a disagreeing twin: its note)
        IF NOT p_new THEN
            UPDATE webhook_events SET status = 'completed', completed_at = now(), updated_at = now(),
                                      last_error = NULL
            WHERE id = p_row_id;
        END IF;
        outcome := CASE WHEN change IN ('payment_duplicate', 'payment_user_disagreed') THEN 'duplicate'
                        ELSE 'processed' END;
    ELSE
        UPDATE webhook_events SET status = CASE WHEN ignored THEN 'ignored' ELSE 'failed' END, completed_at = NULL,
                                  last_error = problem, updated_at = now()
        WHERE id = p_row_id;
        outcome := CASE WHEN ignored THEN 'ignored' WHEN mismatch THEN 'payment_mismatch' ELSE 'failed' END;
    END IF;
END
$$;

-- A user, and a provider's customer linked to one: the rows the money rule
-- reads, made by `flask users add` and `flask users link` (and by the
-- application, as it calls `spend`). Neither changes a row that exists:
-- add_user says whether it added the user and what opening balance the row
-- has; link_customer returns when it linked, NULL when the customer was
-- linked before (to whichever user) or the user does not exist. A Stripe
-- connected account's customer is p_customer 'acct_X/cus_Y', and the
-- connected account itself, whose every payment naming no user (nor a
-- linked customer) credits p_user, is 'acct_X'.
CREATE OR REPLACE FUNCTION add_user(p_user uuid, p_opening bigint DEFAULT 0,
                                    OUT added boolean, OUT opening_balance_cents bigint)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO user_balances (user_id, balance_cents, opening_balance_cents) VALUES (p_user, p_opening, p_opening)
    ON CONFLICT (user_id) DO NOTHING;
    added := FOUND;
    SELECT u.opening_balance_cents INTO opening_balance_cents FROM user_balances AS u WHERE u.user_id = p_user;
END
$$;

-- The application's own keys of its users (user_keys): an integer's digits
-- or a text key, 1 to 255 characters, one per user, never changed nor
-- deleted, so that a payment whose metadata names the key credits the user
-- it named when it was paid. user_of_key: the user of p_key, NULL when
-- none (user_of, for the application's calls, raises P0002 instead:
--   SELECT * FROM spend(p_user => user_of('42'), p_cents => 500, p_reference => 'order-1')).
CREATE OR REPLACE FUNCTION user_of_key(p_key text) RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT k.user_id FROM user_keys k WHERE k.app_key = p_key
$$;

CREATE OR REPLACE FUNCTION user_of(p_key text) RETURNS uuid
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_user uuid := user_of_key(p_key);
BEGIN
    IF v_user IS NULL THEN
        RAISE EXCEPTION 'no user has the key %', coalesce(p_key, 'NULL') USING ERRCODE = 'no_data_found';
    END IF;
    RETURN v_user;
END
$$;

-- A user named by the application's key p_key: the user p_user (a new
-- UUID when NULL, added with p_opening unless it exists) gets the key. Again
-- with the same key: its user, added false, nothing changed (p_user, when
-- given, must be that user: else 23505, as for a user that has another key).
-- A key that cannot be one (22023): empty, or over 255 characters. Returns
-- the key's user, whether this call added the key, and the user's opening
-- balance.
CREATE OR REPLACE FUNCTION add_user_key(p_key text, p_opening bigint DEFAULT 0, p_user uuid DEFAULT NULL,
                                        OUT user_id uuid, OUT added boolean, OUT opening_balance_cents bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_made boolean;
BEGIN
    IF coalesce(char_length(p_key), 0) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'an application''s key of a user must be 1 to 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    user_id := user_of_key(p_key);
    added := false;
    IF user_id IS NULL THEN
        IF EXISTS (SELECT 1 FROM user_keys k WHERE k.user_id = p_user) THEN
            RAISE EXCEPTION 'user % has another key: a user has one key, never changed', p_user
                USING ERRCODE = 'unique_violation';
        END IF;
        user_id := coalesce(p_user, gen_random_uuid());
        v_made := (add_user(p_user => user_id, p_opening => p_opening)).added;
        -- A call adding the same key now makes this insert wait for it, then
        -- find the key taken: the user this call made is deleted again.
        INSERT INTO user_keys (app_key, user_id) VALUES (p_key, add_user_key.user_id)
        ON CONFLICT (app_key) DO NOTHING;
        added := FOUND;
        IF NOT added THEN
            IF v_made THEN
                DELETE FROM user_balances u WHERE u.user_id = add_user_key.user_id;
            END IF;
            user_id := user_of_key(p_key);
        END IF;
    END IF;
    IF p_user IS NOT NULL AND p_user <> user_id THEN
        RAISE EXCEPTION 'key % is user %''s, not user %''s', p_key, user_id, p_user USING ERRCODE = 'unique_violation';
    END IF;
    SELECT u.opening_balance_cents INTO opening_balance_cents FROM user_balances u WHERE u.user_id = add_user_key.user_id;
END
$$;

-- An operator's user for a payment none of whose events names one
-- (`flask payments assign-user`): assigned unless the payment has one
-- (assigned, or credited), or the user does not exist. Returns the
-- payment's user now, credited or assigned (NULL: none), and whether this
-- call assigned it. Locks the assignment's key only: a credit made meanwhile
-- wins, as credit_payment reads the payment before the assignment.
CREATE OR REPLACE FUNCTION assign_payment_user(p_source text, p_payment text, p_user uuid, p_by text,
                                               OUT user_now uuid, OUT assigned boolean, OUT credited boolean)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT p.user_id INTO user_now FROM payments p WHERE p.source = p_source AND p.payment_id = p_payment;
    credited := user_now IS NOT NULL;
    assigned := false;
    IF credited THEN
        RETURN;
    END IF;
    INSERT INTO payment_users (source, payment_id, user_id, assigned_by)
    SELECT p_source, p_payment, p_user, p_by
    WHERE EXISTS (SELECT 1 FROM user_balances u WHERE u.user_id = p_user)
    ON CONFLICT (source, payment_id) DO NOTHING;
    assigned := FOUND;
    SELECT a.user_id INTO user_now FROM payment_users a WHERE a.source = p_source AND a.payment_id = p_payment;
END
$$;

-- A payment keyed in no account that is p_account's, a Stripe connected
-- account's (`flask payments move-to-account`): migration 005 keys such a
-- payment in its account, read from its stored events, and keeps one none
-- of whose events is stored any more. Rewrites what 005 rewrites for a
-- payment, p_payment -> p_account/p_payment: its row (and customer_id), its
-- movements' payment and movement keys, its assignment and its ignored row;
-- its customer's link is copied into the account, as 005 copies it. The
-- journal is append-only: its rows keep their keys, and a 'payment_moved'
-- row (0 cents, moved_from p_payment, actor p_by) says the move, as
-- migration 012 says 005's; ledger_journal_keyed reads them under the new
-- key. The movements' foreign key holds
-- throughout: the row under the new key first, the old one deleted last.
-- Refuses by raising, nothing changed: an unknown payment (P0002
-- no_data_found; moved already: says so), one whose key in the account
-- exists already, or whose key was moved before (23505 unique_violation:
-- two rows of one payment; a key moves once), a key over p_max_chars in
-- the account (22023 invalid_parameter_value). Locks the payment's row
-- first, as every movement of it does. Returns the new key, how many
-- movements moved and how many journal rows are read under it.
DROP FUNCTION IF EXISTS move_payment_to_account(text, text, text, integer);  -- before p_by
CREATE OR REPLACE FUNCTION move_payment_to_account(p_source text, p_payment text, p_account text,
                                                   p_max_chars integer, p_by text, OUT payment_key text,
                                                   OUT movements_moved integer, OUT journal_moved integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_payment payments%ROWTYPE;
    v_key text := p_account || '/' || p_payment;
    v_longest text;
BEGIN
    payment_key := v_key;
    movements_moved := 0;
    journal_moved := 0;
    SELECT * INTO v_payment FROM payments p WHERE p.source = p_source AND p.payment_id = p_payment FOR UPDATE;
    IF NOT FOUND AND NOT EXISTS (SELECT 1 FROM ignored_payments i WHERE i.source = p_source AND i.payment_id = p_payment)
       AND NOT EXISTS (SELECT 1 FROM payment_users a WHERE a.source = p_source AND a.payment_id = p_payment) THEN
        IF EXISTS (SELECT 1 FROM payments p WHERE p.source = p_source AND p.payment_id = v_key) THEN
            RAISE EXCEPTION 'payment % of source % is in account % already (%)', p_payment, p_source, p_account, v_key
                USING ERRCODE = 'no_data_found';
        END IF;
        RAISE EXCEPTION 'unknown payment % of source %', p_payment, p_source USING ERRCODE = 'no_data_found';
    END IF;
    IF EXISTS (SELECT 1 FROM ledger_journal j WHERE j.source = p_source AND j.moved_from = p_payment) THEN
        -- ledger_journal_keyed reads the rows of a key before its move under the key it was moved to.
        RAISE EXCEPTION 'payment % of source % was moved into an account before: the bare % since is another payment',
                        p_payment, p_source, p_payment USING ERRCODE = 'unique_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM payments p WHERE p.source = p_source AND p.payment_id = v_key)
       OR EXISTS (SELECT 1 FROM ignored_payments i WHERE i.source = p_source AND i.payment_id = v_key)
       OR EXISTS (SELECT 1 FROM payment_users a WHERE a.source = p_source AND a.payment_id = v_key) THEN
        RAISE EXCEPTION 'payment % of source % exists already: it and % would be one payment credited twice',
                        v_key, p_source, p_payment USING ERRCODE = 'unique_violation';
    END IF;
    SELECT m.movement_id INTO v_longest FROM movements m
    WHERE m.source = p_source AND m.payment_id = p_payment ORDER BY char_length(m.movement_id) DESC LIMIT 1;
    IF char_length(v_key) > p_max_chars OR char_length(p_account || '/' || v_longest) > p_max_chars THEN
        RAISE EXCEPTION 'the key % in account % would be over % characters, which no event of it may name',
                        CASE WHEN char_length(v_key) > p_max_chars THEN v_key ELSE p_account || '/' || v_longest END,
                        p_account, p_max_chars USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM movements m JOIN movements t
                   ON (t.source, t.kind, t.movement_id) = (m.source, m.kind, p_account || '/' || m.movement_id)
               WHERE m.source = p_source AND m.payment_id = p_payment) THEN
        RAISE EXCEPTION 'a movement of payment % of source % exists already in account %', p_payment, p_source,
                        p_account USING ERRCODE = 'unique_violation';
    END IF;
    IF v_payment.payment_id IS NOT NULL THEN
        INSERT INTO payments (source, payment_id, user_id, amount_cents, currency, refunded_cents, debited_cents,
                              event_id, created_at, updated_at, customer_id)
        VALUES (p_source, v_key, v_payment.user_id, v_payment.amount_cents, v_payment.currency,
                v_payment.refunded_cents, v_payment.debited_cents, v_payment.event_id, v_payment.created_at,
                v_payment.updated_at, p_account || '/' || v_payment.customer_id);
        INSERT INTO customer_links (source, customer_id, user_id, linked_by, created_at)
        SELECT l.source, p_account || '/' || l.customer_id, l.user_id, l.linked_by, l.created_at
        FROM customer_links l
        WHERE l.source = p_source AND l.customer_id = v_payment.customer_id
            AND char_length(p_account || '/' || l.customer_id) <= p_max_chars
        ON CONFLICT (source, customer_id) DO NOTHING;
        UPDATE movements m SET payment_id = v_key, movement_id = p_account || '/' || m.movement_id
        WHERE m.source = p_source AND m.payment_id = p_payment;
        GET DIAGNOSTICS movements_moved = ROW_COUNT;
        -- The rows read under the new key from now on: the payment's user's alone (`ledger verify` checks it;
        -- the user's index finds them).
        SELECT count(*) INTO journal_moved FROM ledger_journal j
        WHERE j.user_id = v_payment.user_id AND j.source = p_source AND j.payment_id = p_payment;
        INSERT INTO ledger_journal (kind, source, payment_id, moved_from, user_id, amount_cents, actor)
        VALUES ('payment_moved', p_source, v_key, p_payment, v_payment.user_id, 0, p_by);
        DELETE FROM payments p WHERE p.source = p_source AND p.payment_id = p_payment;
    END IF;
    UPDATE payment_users a SET payment_id = v_key WHERE a.source = p_source AND a.payment_id = p_payment;
    UPDATE ignored_payments i SET payment_id = v_key WHERE i.source = p_source AND i.payment_id = p_payment;
END
$$;

CREATE OR REPLACE FUNCTION link_customer(p_source text, p_customer text, p_user uuid, p_by text,
                                         OUT linked_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO customer_links (source, customer_id, user_id, linked_by)
    SELECT p_source, p_customer, p_user, p_by
    WHERE EXISTS (SELECT 1 FROM user_balances WHERE user_id = p_user)
    ON CONFLICT (source, customer_id) DO NOTHING
    RETURNING created_at INTO linked_at;
END
$$;

-- The journal rows that no event writes: an operator's adjustment and the
-- application's spend. Each is one statement that locks the user's row
-- (which serialises every change of that balance), changes the balance and
-- writes its journal row, so that balance = opening + journal holds. Both
-- refuse by raising, with nothing changed (docs/operations.md lists the
-- SQLSTATEs too): whenever one returns, its row is in the journal.
--   22023 invalid_parameter_value     an amount, reference, reason or actor
--                                     that cannot be journaled (0, negative
--                                     for a spend, empty, too long); (adjust)
--                                     a payment of another user
--   P0002 no_data_found               the user has no balance row; (adjust)
--                                     the payment is unknown
--   22003 numeric_value_out_of_range  the balance would leave BIGINT's range
--   23514 check_violation             (spend) the balance would go below
--                                     zero, and p_allow_negative is false
--   23505 unique_violation            (spend) the reference was spent
--                                     before, with another user or amount

-- An operator's correction (`flask ledger adjust`): p_cents, either sign,
-- added to p_user's balance and journaled as an 'adjustment' with p_reason
-- and p_actor (who made it). Not idempotent: each call is one more
-- correction. An adjustment that corrects a payment's credit names it,
-- p_source and p_payment:
-- `flask ledger verify` then counts it with the payment's credits, which
-- must add up to its amount. Locks the payment's row (when named), then the
-- user's: the order apply_event takes them in. Returns the journal row's id
-- and the balance it left.
CREATE OR REPLACE FUNCTION adjust(p_user uuid, p_cents bigint, p_reason text, p_actor text,
                                  p_source text DEFAULT NULL, p_payment text DEFAULT NULL,
                                  OUT journal_id bigint, OUT balance_after bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_paid_to uuid;
    v_balance bigint;
BEGIN
    IF coalesce(p_cents, 0) = 0 THEN
        RAISE EXCEPTION 'an adjustment of 0 cents changes nothing' USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_reason IS NULL OR p_reason !~ '\S' THEN
        RAISE EXCEPTION 'an adjustment needs a reason' USING ERRCODE = 'invalid_parameter_value';
    ELSIF char_length(p_reason) > 500 THEN
        RAISE EXCEPTION 'the reason is % characters long, over 500', char_length(p_reason)
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF coalesce(char_length(p_actor), 0) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'who made the adjustment must be named in 1 to 128 characters'
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF (p_source IS NULL) <> (p_payment IS NULL) THEN
        RAISE EXCEPTION 'a payment is named by its source and its id, both' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_payment IS NOT NULL THEN
        SELECT user_id INTO v_paid_to FROM payments WHERE source = p_source AND payment_id = p_payment FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'unknown payment % of source %', p_payment, p_source USING ERRCODE = 'no_data_found';
        ELSIF v_paid_to <> p_user THEN
            RAISE EXCEPTION 'payment % was credited to user %, not to user %', p_payment, v_paid_to, p_user
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    SELECT balance_cents INTO v_balance FROM user_balances WHERE user_id = p_user FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown user %', p_user USING ERRCODE = 'no_data_found';
    ELSIF p_cents > 0 AND v_balance > 9223372036854775807 - p_cents
       OR p_cents < 0 AND v_balance < -9223372036854775808 - p_cents THEN
        RAISE EXCEPTION 'an adjustment of % cents would overflow the balance of user % (% cents)',
                        p_cents, p_user, v_balance USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    UPDATE user_balances SET balance_cents = balance_cents + p_cents, updated_at = now()
    WHERE user_id = p_user RETURNING balance_cents INTO balance_after;
    INSERT INTO ledger_journal (kind, source, payment_id, user_id, amount_cents, reason, actor)
    VALUES ('adjustment', p_source, p_payment, p_user, p_cents, p_reason, p_actor)
    RETURNING id INTO journal_id;
END
$$;

-- The application spends p_cents (> 0) of p_user's credit, once per
-- p_reference (1-128 characters, the application's own key: an order, a
-- request id), journaled as a 'spend' of -p_cents. Call it with named
-- arguments, alone or inside the application's own transaction:
--   SELECT * FROM spend(p_user => $1, p_cents => $2, p_reference => $3)
-- The available balance (the balance less the user's active holds) may
-- not go below zero unless p_allow_negative (then the balance may, within
-- BIGINT's range). A second call with the same reference, user and
-- amount changes nothing and returns the first call's row, outcome
-- 'duplicate'; with another user or amount it is refused (23505). A refused
-- call records nothing: its reference may be tried again. Returns the
-- outcome ('spent' or 'duplicate'), the spend's journal row and when it was
-- made, and the user's balance as the call leaves it (on a duplicate, the
-- balance now).
CREATE OR REPLACE FUNCTION spend(p_user uuid, p_cents bigint, p_reference text, p_allow_negative boolean DEFAULT FALSE,
                                 OUT outcome text, OUT journal_id bigint, OUT spent_at timestamptz,
                                 OUT balance_cents bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_first ledger_journal%ROWTYPE;
    v_held numeric;
BEGIN
    IF p_cents IS NULL OR p_cents <= 0 THEN
        RAISE EXCEPTION 'a spend of % cents: the amount must be positive', coalesce(p_cents::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF coalesce(char_length(p_reference), 0) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'a spend''s reference must be 1 to 128 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The user's row first: a second call with the same reference waits for
    -- the first one's commit here, then finds its row.
    SELECT u.balance_cents INTO balance_cents FROM user_balances u WHERE u.user_id = p_user FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown user %', p_user USING ERRCODE = 'no_data_found';
    ELSIF EXISTS (SELECT 1 FROM holds h WHERE h.reference = p_reference) THEN
        RAISE EXCEPTION 'reference % is a hold''s: capture_hold spends it', p_reference
            USING ERRCODE = 'unique_violation';
    END IF;
    SELECT * INTO v_first FROM ledger_journal j WHERE j.kind = 'spend' AND j.reference = p_reference;
    IF FOUND THEN
        IF (v_first.user_id, -v_first.amount_cents) <> (p_user, p_cents) THEN
            RAISE EXCEPTION 'reference % was spent by journal row % with another user or amount',
                            p_reference, v_first.id USING ERRCODE = 'unique_violation';
        END IF;
        outcome := 'duplicate';
        journal_id := v_first.id;
        spent_at := v_first.created_at;
        RETURN;
    END IF;
    -- What the user's active holds reserve is not spendable (available_balance).
    v_held := held_cents(p_user);
    IF balance_cents - v_held < p_cents AND NOT coalesce(p_allow_negative, false) THEN
        IF v_held = 0 THEN
            RAISE EXCEPTION 'the balance of user % is % cents: spending % would take it below zero',
                            p_user, balance_cents, p_cents USING ERRCODE = 'check_violation';
        END IF;
        RAISE EXCEPTION 'the available balance of user % is % cents (% cents held): spending % would take it '
                        'below zero', p_user, balance_cents - v_held, v_held, p_cents USING ERRCODE = 'check_violation';
    ELSIF balance_cents < -9223372036854775808 + p_cents THEN
        RAISE EXCEPTION 'spending % cents would overflow the balance of user % (% cents)',
                        p_cents, p_user, balance_cents USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    UPDATE user_balances u SET balance_cents = u.balance_cents - p_cents, updated_at = now()
    WHERE u.user_id = p_user RETURNING u.balance_cents INTO balance_cents;
    -- A spend of the same reference by another user, running now, makes this
    -- insert wait for it, then fail on the key: 23505 as well.
    INSERT INTO ledger_journal (kind, user_id, amount_cents, reference)
    VALUES ('spend', p_user, -p_cents, p_reference)
    RETURNING id, created_at INTO journal_id, spent_at;
    outcome := 'spent';
END
$$;

-- The change feed: the journal rows committed after p_cursor (NULL: from the
-- first), at most p_limit, each with the cursor that resumes after it. A
-- batch is the rows of the transactions that committed between two
-- snapshots (not visible in its first, visible in its second), in id order;
-- when one is read, the next runs from its second snapshot to now. A row
-- commits before it is read, whatever order ids were given in, and a user's
-- rows come in the order their transactions locked the user's balance
-- (docs/operations.md, "Following the journal").
DROP FUNCTION IF EXISTS journal_changes(text, integer);  -- its rows before moved_from
CREATE OR REPLACE FUNCTION journal_changes(p_cursor text DEFAULT NULL, p_limit integer DEFAULT 1000)
RETURNS TABLE (
    cursor text, id bigint, user_id uuid, amount_cents bigint, kind text, source text, event_id text,
    payment_id text, movement_id text, reference text, created_at timestamptz, moved_from text
)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_parts text[] := string_to_array(coalesce(p_cursor, '1:1:|1:1:|0'), '|');
    v_from pg_snapshot;
    v_to pg_snapshot;
    v_after bigint;
BEGIN
    IF cardinality(v_parts) <> 3 THEN
        RAISE EXCEPTION 'not a cursor of journal_changes: %', left(p_cursor, 100) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_from := v_parts[1]::pg_snapshot;
    v_to := v_parts[2]::pg_snapshot;
    v_after := v_parts[3]::bigint;
    FOR attempt IN 1..2 LOOP
        RETURN QUERY
            SELECT concat_ws('|', v_from, v_to, j.id), j.id, j.user_id, j.amount_cents, j.kind, j.source,
                   j.event_id, j.payment_id, j.movement_id, j.reference, j.created_at, j.moved_from
            FROM ledger_journal AS j
            WHERE j.xid >= pg_snapshot_xmin(v_from) AND j.xid < pg_snapshot_xmax(v_to)
                AND NOT pg_visible_in_snapshot(j.xid, v_from) AND pg_visible_in_snapshot(j.xid, v_to)
                AND j.id > v_after
            ORDER BY j.id
            LIMIT p_limit;
        IF FOUND OR attempt = 2 THEN
            RETURN;
        END IF;
        v_from := v_to;  -- this batch is read: the next one
        v_to := pg_current_snapshot();
        v_after := 0;
    END LOOP;
END
$$;

-- Holds: the application reserves up to p_cents of a user's credit before
-- work whose cost it knows only after (docs/operations.md, "Holding credit
-- before work"). A hold is 'held' until captured (one spend of what the
-- work cost, up to the hold, the rest freed), released (nothing taken), or
-- past its expires_at: then it no longer counts, whoever reads it, with no
-- sweeper (release_hold closes it, `flask users tidy-holds` all of them).
-- Holds only bound what the application itself takes (spend, place_hold):
-- refunds and disputes never read them, and may take a balance below what
-- is held. Each is idempotent by the application's reference, which is
-- also the reference of the spend a capture writes, and refuses by raising,
-- nothing changed (the SQLSTATEs of spend, and 55000
-- object_not_in_prerequisite_state: a hold captured, released or expired
-- asked to do what its state no longer allows).
--
-- Locks, in the order every function of the application takes them: the
-- user's row (FOR UPDATE, as spend and every event's balance change: it
-- serialises every change of one balance and every hold of one user), then
-- the hold's row. An event's movement locks its payment's row, then the
-- user's, and never a hold's: no cycle. A hold's user never changes, so it
-- is read before the lock without one.

-- What p_user's active holds reserve now: held, and not expired.
CREATE OR REPLACE FUNCTION held_cents(p_user uuid) RETURNS numeric
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(h.amount_cents), 0) FROM holds h
    WHERE h.user_id = p_user AND h.state = 'held' AND h.expires_at > now()
$$;

-- Each user's balance, what its active holds reserve, and what is left to
-- spend or hold (available_cents, below zero when a refund or a dispute
-- took credit that was held).
CREATE OR REPLACE VIEW user_available AS
SELECT
    u.user_id,
    u.balance_cents,
    a.held::bigint AS held_cents,
    (u.balance_cents - a.held)::bigint AS available_cents
FROM user_balances AS u
CROSS JOIN LATERAL (  -- held_cents's query, inline: a view reads its tables with its owner's rights, not its functions
    SELECT coalesce(sum(h.amount_cents), 0) AS held FROM holds AS h
    WHERE h.user_id = u.user_id AND h.state = 'held' AND h.expires_at > now()
) AS a;

-- One user's row of user_available (P0002 for an unknown user).
CREATE OR REPLACE FUNCTION available_balance(p_user uuid, OUT balance_cents bigint, OUT held_cents bigint,
                                             OUT available_cents bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT a.balance_cents, a.held_cents, a.available_cents INTO balance_cents, held_cents, available_cents
    FROM user_available a WHERE a.user_id = p_user;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown user %', p_user USING ERRCODE = 'no_data_found';
    END IF;
END
$$;

-- Hold p_cents (> 0) of p_user's credit until p_expires_at (in the future),
-- once per p_reference (1-128 characters, the application's key; not a
-- spend's). Refused (23514) when the available balance is short, unless
-- p_allow_negative. Again with the same reference, user, amount and expiry:
-- outcome 'duplicate', whatever the hold's state now; with others, 23505.
-- Returns the outcome ('held' or 'duplicate'), the hold's expiry and the
-- user's available balance as the call leaves it.
CREATE OR REPLACE FUNCTION place_hold(p_user uuid, p_cents bigint, p_reference text, p_expires_at timestamptz,
                                      p_allow_negative boolean DEFAULT FALSE,
                                      OUT outcome text, OUT expires_at timestamptz, OUT available_cents bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_balance bigint;
    v_first holds%ROWTYPE;
    v_held numeric;
BEGIN
    IF p_cents IS NULL OR p_cents <= 0 THEN
        RAISE EXCEPTION 'a hold of % cents: the amount must be positive', coalesce(p_cents::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF coalesce(char_length(p_reference), 0) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'a hold''s reference must be 1 to 128 characters' USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_expires_at IS NULL OR p_expires_at <= now() THEN
        RAISE EXCEPTION 'a hold must expire after now, not at %', coalesce(p_expires_at::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT u.balance_cents INTO v_balance FROM user_balances u WHERE u.user_id = p_user FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown user %', p_user USING ERRCODE = 'no_data_found';
    END IF;
    v_held := held_cents(p_user);
    SELECT * INTO v_first FROM holds h WHERE h.reference = p_reference;
    IF FOUND THEN
        IF (v_first.user_id, v_first.amount_cents, v_first.expires_at) <> (p_user, p_cents, p_expires_at) THEN
            RAISE EXCEPTION 'reference % was held with another user, amount or expiry', p_reference
                USING ERRCODE = 'unique_violation';
        END IF;
        outcome := 'duplicate';
        expires_at := v_first.expires_at;
        available_cents := v_balance - v_held;
        RETURN;
    ELSIF EXISTS (SELECT 1 FROM ledger_journal j WHERE j.kind = 'spend' AND j.reference = p_reference) THEN
        RAISE EXCEPTION 'reference % was spent: a hold''s reference is the spend its capture writes', p_reference
            USING ERRCODE = 'unique_violation';
    ELSIF v_balance - v_held < p_cents AND NOT coalesce(p_allow_negative, false) THEN
        RAISE EXCEPTION 'the available balance of user % is % cents (% cents held): holding % would take it '
                        'below zero', p_user, v_balance - v_held, v_held, p_cents USING ERRCODE = 'check_violation';
    ELSIF v_balance - v_held - p_cents < -9223372036854775808 THEN
        RAISE EXCEPTION 'holding % cents would take the available balance of user % past BIGINT''s range',
                        p_cents, p_user USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    -- A hold of the same reference for another user, placed now, makes this
    -- insert wait for it, then fail on the key: 23505 as well.
    INSERT INTO holds (reference, user_id, amount_cents, expires_at)
    VALUES (p_reference, p_user, p_cents, p_expires_at);
    outcome := 'held';
    expires_at := p_expires_at;
    available_cents := v_balance - v_held - p_cents;
END
$$;

-- The hold p_reference, its user's row locked, then its own (P0002 when no
-- hold has that reference).
CREATE OR REPLACE FUNCTION lock_hold(p_reference text) RETURNS holds
LANGUAGE plpgsql AS $$
DECLARE
    v_hold holds%ROWTYPE;
BEGIN
    SELECT * INTO v_hold FROM holds h WHERE h.reference = p_reference;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no hold %', coalesce(p_reference, 'NULL') USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM FROM user_balances u WHERE u.user_id = v_hold.user_id FOR UPDATE;
    SELECT * INTO v_hold FROM holds h WHERE h.reference = p_reference FOR UPDATE;
    RETURN v_hold;
END
$$;

-- Capture p_cents (1 up to the hold's amount) of hold p_reference: one
-- spend of p_cents, journaled with the hold's reference, the rest freed.
-- The balance may not go below zero unless p_allow_negative (the hold's
-- own credit counts; a refund or dispute since may have taken it). Again
-- with the same amount: outcome 'duplicate' and the first capture's row;
-- with another, 23505. A released or expired hold: 55000. Returns the
-- outcome ('captured' or 'duplicate'), the spend's journal row and when it
-- was made, and the user's balance as the call leaves it.
CREATE OR REPLACE FUNCTION capture_hold(p_reference text, p_cents bigint, p_allow_negative boolean DEFAULT FALSE,
                                        OUT outcome text, OUT journal_id bigint, OUT captured_at timestamptz,
                                        OUT balance_cents bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_hold holds%ROWTYPE;
BEGIN
    IF p_cents IS NULL OR p_cents <= 0 THEN
        RAISE EXCEPTION 'a capture of % cents: the amount must be positive (release_hold takes nothing)',
                        coalesce(p_cents::text, 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_hold := lock_hold(p_reference);
    SELECT u.balance_cents INTO balance_cents FROM user_balances u WHERE u.user_id = v_hold.user_id;
    IF v_hold.state = 'captured' THEN
        IF v_hold.captured_cents <> p_cents THEN
            RAISE EXCEPTION 'hold % was captured for % cents, not %', p_reference, v_hold.captured_cents, p_cents
                USING ERRCODE = 'unique_violation';
        END IF;
        outcome := 'duplicate';
        journal_id := v_hold.journal_id;
        captured_at := v_hold.closed_at;
        RETURN;
    ELSIF v_hold.state = 'released' THEN
        RAISE EXCEPTION 'hold % was released' , p_reference USING ERRCODE = 'object_not_in_prerequisite_state';
    ELSIF v_hold.expires_at <= now() THEN
        RAISE EXCEPTION 'hold % expired at %', p_reference, v_hold.expires_at
            USING ERRCODE = 'object_not_in_prerequisite_state';
    ELSIF p_cents > v_hold.amount_cents THEN
        RAISE EXCEPTION 'a capture of % cents is more than hold %''s % cents', p_cents, p_reference,
                        v_hold.amount_cents USING ERRCODE = 'invalid_parameter_value';
    ELSIF balance_cents < p_cents AND NOT coalesce(p_allow_negative, false) THEN
        RAISE EXCEPTION 'the balance of user % is % cents: capturing % would take it below zero',
                        v_hold.user_id, balance_cents, p_cents USING ERRCODE = 'check_violation';
    ELSIF balance_cents < -9223372036854775808 + p_cents THEN
        RAISE EXCEPTION 'capturing % cents would overflow the balance of user % (% cents)',
                        p_cents, v_hold.user_id, balance_cents USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    UPDATE user_balances u SET balance_cents = u.balance_cents - p_cents, updated_at = now()
    WHERE u.user_id = v_hold.user_id RETURNING u.balance_cents INTO balance_cents;
    INSERT INTO ledger_journal (kind, user_id, amount_cents, reference)
    VALUES ('spend', v_hold.user_id, -p_cents, p_reference)
    RETURNING id, created_at INTO journal_id, captured_at;
    UPDATE holds h SET state = 'captured', captured_cents = p_cents, journal_id = capture_hold.journal_id,
                       closed_at = captured_at
    WHERE h.reference = p_reference;
    outcome := 'captured';
END
$$;

-- Release hold p_reference: it reserves nothing from now on, and takes
-- nothing. Held (expired or not): outcome 'released'; released before:
-- 'duplicate'; captured: 55000. Returns the outcome and the user's
-- available balance as the call leaves it.
CREATE OR REPLACE FUNCTION release_hold(p_reference text, OUT outcome text, OUT available_cents bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_hold holds%ROWTYPE;
    v_balance bigint;
BEGIN
    v_hold := lock_hold(p_reference);
    SELECT u.balance_cents INTO v_balance FROM user_balances u WHERE u.user_id = v_hold.user_id;
    IF v_hold.state = 'captured' THEN
        RAISE EXCEPTION 'hold % was captured (journal row %)', p_reference, v_hold.journal_id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    ELSIF v_hold.state = 'released' THEN
        outcome := 'duplicate';
    ELSE
        UPDATE holds h SET state = 'released', closed_at = now() WHERE h.reference = p_reference;
        outcome := 'released';
    END IF;
    available_cents := v_balance - held_cents(v_hold.user_id);
END
$$;

-- Release every hold that expired before p_before (`flask users
-- tidy-holds`): tidying only, since an expired hold counts for nothing
-- already. Locks each hold's row only (SKIP LOCKED: one being captured or
-- released now is left to that call). Returns how many it released.
CREATE OR REPLACE FUNCTION release_expired_holds(p_before timestamptz DEFAULT now(), OUT released integer)
LANGUAGE plpgsql AS $$
BEGIN
    WITH expired AS (
        SELECT h.reference FROM holds h
        WHERE h.state = 'held' AND h.expires_at <= least(p_before, now())
        FOR UPDATE SKIP LOCKED
    )
    UPDATE holds h SET state = 'released', closed_at = now() FROM expired e WHERE h.reference = e.reference;
    GET DIAGNOSTICS released = ROW_COUNT;
END
$$;

-- Give back the spend p_reference (a spend, or a hold's capture): once,
-- journaled as a 'give_back' of the spend's amount to its user, naming its
-- reference. Again: outcome 'duplicate' and the first give-back's row. An
-- unknown spend: P0002; a balance past BIGINT's range: 22003. Locks the
-- spend's user's row. Returns the outcome ('given_back' or 'duplicate'),
-- the give-back's journal row and when it was made, and the user's balance
-- as the call leaves it (on a duplicate, the balance now).
CREATE OR REPLACE FUNCTION give_back(p_reference text, OUT outcome text, OUT journal_id bigint,
                                     OUT given_back_at timestamptz, OUT balance_cents bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_spend ledger_journal%ROWTYPE;
    v_first ledger_journal%ROWTYPE;
BEGIN
    SELECT * INTO v_spend FROM ledger_journal j WHERE j.kind = 'spend' AND j.reference = p_reference;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no spend %', coalesce(p_reference, 'NULL') USING ERRCODE = 'no_data_found';
    END IF;
    -- A second call waits here for the first one's commit, then finds its row.
    SELECT u.balance_cents INTO balance_cents FROM user_balances u WHERE u.user_id = v_spend.user_id FOR UPDATE;
    SELECT * INTO v_first FROM ledger_journal j WHERE j.kind = 'give_back' AND j.reference = p_reference;
    IF FOUND THEN
        outcome := 'duplicate';
        journal_id := v_first.id;
        given_back_at := v_first.created_at;
        RETURN;
    ELSIF balance_cents > 9223372036854775807 + v_spend.amount_cents THEN
        RAISE EXCEPTION 'giving back % cents would overflow the balance of user % (% cents)',
                        -v_spend.amount_cents, v_spend.user_id, balance_cents
            USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    UPDATE user_balances u SET balance_cents = u.balance_cents - v_spend.amount_cents, updated_at = now()
    WHERE u.user_id = v_spend.user_id RETURNING u.balance_cents INTO balance_cents;
    INSERT INTO ledger_journal (kind, user_id, amount_cents, reference)
    VALUES ('give_back', v_spend.user_id, -v_spend.amount_cents, p_reference)
    RETURNING id, created_at INTO journal_id, given_back_at;
    outcome := 'given_back';
END
$$;

-- Statements: a user's balance at a time, and its movements of a period,
-- from the journal alone (balance = opening + journal). A journal row's
-- time is its created_at, its transaction's start; the period [p_from,
-- p_to) is half open, so consecutive periods share no row, and a
-- statement's closing balance is the next one's opening. P0002 for an
-- unknown user; 22023 for a period that ends before it starts.

-- p_user's balance at p_at: its opening balance plus its journal rows
-- before p_at.
CREATE OR REPLACE FUNCTION balance_at(p_user uuid, p_at timestamptz, OUT balance_cents bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT u.opening_balance_cents + coalesce((
        SELECT sum(j.amount_cents) FROM ledger_journal j WHERE j.user_id = p_user AND j.created_at < p_at), 0)
    INTO balance_cents FROM user_balances u WHERE u.user_id = p_user;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown user %', p_user USING ERRCODE = 'no_data_found';
    END IF;
END
$$;

-- p_user's journal rows of [p_from, p_to), in the order they changed the
-- balance (id: each locked the user's row before it took its id), each
-- with the balance it left; the balance before the first is balance_at(
-- p_user, p_from), after the last balance_at(p_user, p_to).
CREATE OR REPLACE FUNCTION statement(p_user uuid, p_from timestamptz, p_to timestamptz)
RETURNS TABLE (
    id bigint, created_at timestamptz, kind text, amount_cents bigint, balance_after_cents bigint, source text,
    event_id text, payment_id text, movement_id text, reference text, reason text, actor text
)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_opening bigint := balance_at(p_user, p_from);
BEGIN
    IF p_to < p_from THEN
        RAISE EXCEPTION 'a period from % to % ends before it starts', p_from, p_to
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
        SELECT j.id, j.created_at, j.kind, j.amount_cents,
               (v_opening + sum(j.amount_cents) OVER (ORDER BY j.id))::bigint, j.source, j.event_id, j.payment_id,
               j.movement_id, j.reference, j.reason, j.actor
        FROM ledger_journal j
        WHERE j.user_id = p_user AND j.created_at >= p_from AND j.created_at < p_to
        ORDER BY j.id;
END
$$;

-- The application's role, webhook_ledger_app (NOLOGIN: a DBA grants it to
-- the application's login role, docs/operations.md, "The application's
-- role"). It may execute the application's functions below and read
-- user_balances, ledger_journal, holds and user_available, nothing else:
-- no table grants it a write. Each of these functions runs as its owner
-- (SECURITY DEFINER) with search_path fixed to the ledger's schema then
-- pg_temp, so that no object the caller creates is found in its place; the
-- right to execute it is taken from PUBLIC (every role has it by default)
-- and given to the role alone. A role is the cluster's, not a database's:
-- one that exists is used as it is. An owner without CREATEROLE cannot
-- create it: the notice says so, and the next init-db after a DBA's CREATE
-- ROLE webhook_ledger_app NOLOGIN grants it.
DO $$
DECLARE
    v_function regprocedure;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'webhook_ledger_app') THEN
        BEGIN
            CREATE ROLE webhook_ledger_app NOLOGIN;
        EXCEPTION WHEN insufficient_privilege OR duplicate_object OR unique_violation THEN
            RAISE NOTICE 'role webhook_ledger_app not created (%): the application''s functions stay the owner''s', SQLERRM;
        END;
    END IF;
    FOR v_function IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace
            AND p.proname IN ('add_user', 'add_user_key', 'user_of', 'link_customer', 'spend', 'journal_changes',
                              'available_balance', 'place_hold', 'capture_hold', 'release_hold', 'give_back',
                              'balance_at', 'statement')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp', v_function, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_function);
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'webhook_ledger_app') THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO webhook_ledger_app', v_function);
        END IF;
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'webhook_ledger_app') THEN
        GRANT SELECT ON user_balances, user_keys, ledger_journal, holds, user_available TO webhook_ledger_app;
        BEGIN  -- the schema's owner grants it; public's usage is every role's already
            EXECUTE format('GRANT USAGE ON SCHEMA %I TO webhook_ledger_app', current_schema());
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'usage of schema % not granted to webhook_ledger_app (%)', current_schema(), SQLERRM;
        END;
    END IF;
END
$$;
