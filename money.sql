-- The money rule, written once. `flask init-db` applies this whole file after
-- schema.sql or the migrations, every time (a repeatable step, in the same
-- transaction, under the same lock), so a change to the rule is one diff
-- here; migrations change tables only. Everything in it is CREATE OR
-- REPLACE, or dropped and created again: safe to apply twice. A function
-- whose OUT parameters change must be dropped first (CREATE OR REPLACE
-- cannot change them). tests/test_money.py holds the literals below to the
-- Python enums (app/events.py, app/ledger.py, app/delivery.py).
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
-- Each payment's account: what was credited, what its refunds (by object and
-- by running total) and disputes took and gave back, what is due and what is
-- debited. apply_event moves the balance to `debit_due_cents`; `flask ledger
-- verify` checks that `debited_cents` equals it and the journal.
CREATE VIEW payment_accounts AS
SELECT p.source, p.payment_id, p.user_id, p.currency,
       p.amount_cents AS credited_cents,
       p.refunded_cents AS refunded_total_cents,
       m.refunds_known_cents, m.refunds_applied_cents, m.refunds_reversed_cents,
       m.disputes_withdrawn_cents, m.disputes_reinstated_cents,
       least(p.amount_cents, m.refunds_applied_cents + greatest(0, p.refunded_cents - m.refunds_known_cents)
                             + m.disputes_withdrawn_cents) AS debit_due_cents,
       p.debited_cents
FROM payments p
CROSS JOIN LATERAL (
    SELECT coalesce(sum(amount_cents) FILTER (WHERE kind = 'refund'), 0) AS refunds_known_cents,
           coalesce(sum(amount_cents) FILTER (WHERE kind = 'refund' AND state = 'applied'), 0)
               AS refunds_applied_cents,
           coalesce(sum(amount_cents) FILTER (WHERE kind = 'refund' AND state = 'reversed'), 0)
               AS refunds_reversed_cents,
           coalesce(sum(amount_cents) FILTER (WHERE kind = 'dispute' AND state = 'applied'), 0)
               AS disputes_withdrawn_cents,
           coalesce(sum(amount_cents) FILTER (WHERE kind = 'dispute' AND state = 'reversed'), 0)
               AS disputes_reinstated_cents
    FROM movements m WHERE m.source = p.source AND m.payment_id = p.payment_id
) m;

-- Every delivery (new, retried, replayed, reconciled) of every event is
-- recorded and applied by this one function, in one statement
-- (app/ledger.py, called with named arguments). The caller has parsed the
-- bytes and checked what it can without the database: p_problem is why the
-- event cannot apply (NULL: it can); p_kind what it moves: 'credit',
-- 'refunded_total', 'refund', 'dispute', or NULL (nothing); p_amount a
-- credit's amount, a running total, or a movement's amount; p_user a
-- credit's user (every other movement's is its payment's); p_movement a
-- refund's or a dispute's id, and p_state what the event says of it,
-- 'applied' or 'reversed'; p_ledger_currency and p_test_events the settings
-- the caller decided under (LEDGER_CURRENCY, STRIPE_ACCEPT_TEST_EVENTS),
-- recorded with the event, so that `flask ledger verify` judges it by them. It returns the outcome ('processed', 'duplicate',
-- 'failed', 'payload_mismatch' or 'payment_mismatch'), why it failed, the
-- SHA-256 of the bytes stored before this delivery (when the event was
-- stored already), the balance change made ('credit', 'refund',
-- 'refund_reversed', 'dispute_withdrawn', 'dispute_reinstated',
-- 'payment_duplicate': a credited payment announced again, or NULL) and the
-- balance it left.
--
-- p_origin says where the bytes came from ('delivery', 'reconcile': the
-- provider's event list), recorded with them; NULL (a replay of the stored
-- bytes) keeps what the row says.
--
-- A credit whose p_user is NULL (its metadata names none under p_user_key,
-- the source's WEBHOOK_<NAME>_USER_METADATA_KEY) is credited to the user
-- that customer_links maps p_customer to (payments.customer_id says so).
-- With neither, p_no_user decides: 'refuse' fails it (422, a retry or a
-- replay applies it once a link is made), 'ignore' records it 'ignored'
-- (outcome 'ignored', a 2xx) and its payment in ignored_payments, whose
-- refunds and disputes are then ignored too. p_user_key and p_no_user are
-- recorded with the event. A delivery of an ignored or a dismissed event is
-- 'ignored' again, nothing changed; only a replay (p_origin NULL) tries it
-- again. The link is read, not locked: links are never changed nor deleted.
--
-- Locks, always in this order, so that two deliveries never wait on each
-- other in a circle: the event's row (its insert, or FOR UPDATE), then the
-- payment's row (a credit's insert of its key, any other movement's FOR
-- UPDATE, which serialises every movement of one payment), then the
-- movement's row, then the user's row. A wait longer than lock_timeout ends
-- the statement with nothing committed (503, retried).
CREATE OR REPLACE FUNCTION apply_event(
    p_source text, p_event_id text, p_type text, p_body bytea, p_sha256 bytea, p_effect bytea,
    p_problem text, p_kind text, p_payment text, p_user uuid, p_amount bigint,
    p_currency text, p_movement text, p_state text, p_ledger_currency text, p_test_events boolean,
    p_origin text, p_customer text, p_user_key text, p_no_user text,
    OUT outcome text, OUT problem text, OUT stored_sha256 bytea, OUT change text, OUT balance_after bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_user uuid := p_user;
    v_linked boolean := false;
    v_ignored boolean := false;
    v_row_id bigint;
    v_status text;
    v_effect bytea;
    v_payment payments%ROWTYPE;
    v_movement movements%ROWTYPE;
    v_due bigint;
    v_mismatch boolean := false;
    v_new boolean;
BEGIN
    -- Record: a new event is inserted as it will most likely end, completed
    -- unless its problem is known, so that its row is written once; the rare
    -- decision that fails it below writes it again. A purged event that
    -- changed a balance is never inserted again.
    INSERT INTO webhook_events (source, event_id, event_type, body, payload_sha256, effect_sha256,
                                status, completed_at, last_error, ledger_currency, test_events_accepted, origin,
                                user_metadata_key, no_user)
    SELECT p_source, p_event_id, p_type, p_body, p_sha256, p_effect,
           CASE WHEN p_problem IS NOT NULL THEN 'failed' ELSE 'completed' END,
           CASE WHEN p_problem IS NULL THEN now() END, p_problem, p_ledger_currency, p_test_events,
           coalesce(p_origin, 'delivery'), p_user_key, p_no_user
    WHERE NOT EXISTS (SELECT 1 FROM ledger_journal j WHERE j.source = p_source AND j.event_id = p_event_id)
    ON CONFLICT (source, event_id) DO NOTHING
    RETURNING id INTO v_row_id;
    v_new := v_row_id IS NOT NULL;

    IF NOT v_new THEN
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
        -- A row whose stored bytes do not parse (no effect) is compared by
        -- its bytes. A failed event whose provider had no record of it (its effect all
        -- zeros, app/providers/) takes whatever effect the provider has now:
        -- a body forged under a genuine event's id cannot hold the id.
        IF coalesce(v_effect <> p_effect, stored_sha256 <> p_sha256)
           AND NOT (v_status = 'failed' AND v_effect = decode(repeat('00', 32), 'hex')) THEN
            UPDATE webhook_events SET mismatches = mismatches + 1, last_mismatch_at = now() WHERE id = v_row_id;
            outcome := 'payload_mismatch';
            RETURN;
        END IF;
        IF v_status = 'completed' THEN
            outcome := 'duplicate';
            RETURN;
        ELSIF (v_status = 'ignored' OR v_status = 'dismissed') AND p_origin IS NOT NULL THEN
            outcome := 'ignored';  -- closed: only an operator's replay opens it again
            problem := 'the event is ' || v_status;
            RETURN;
        END IF;
        -- A failed event, tried again from this delivery's bytes (and type:
        -- another only when the provider had no record of it before).
        UPDATE webhook_events
        SET attempts = attempts + 1, updated_at = now(), event_type = p_type, body = p_body, payload_sha256 = p_sha256,
            effect_sha256 = p_effect, effect_version = DEFAULT, ledger_currency = p_ledger_currency,
            test_events_accepted = p_test_events,
            origin = coalesce(p_origin, origin), user_metadata_key = p_user_key, no_user = p_no_user
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
    IF problem IS NULL AND p_kind = 'credit' AND v_user IS NULL THEN
        SELECT l.user_id INTO v_user FROM customer_links l
        WHERE l.source = p_source AND l.customer_id = p_customer;
        v_linked := v_user IS NOT NULL;
        IF NOT v_linked THEN
            problem := format('no user: no data.object.metadata.%s, and %s', coalesce(p_user_key, 'user_id'),
                              CASE WHEN p_customer IS NULL THEN 'no data.object.customer'
                                   ELSE format('customer %s is linked to no user (flask users link %s %s USER_ID)',
                                               p_customer, p_source, p_customer) END);
            IF p_no_user = 'ignore' THEN
                v_ignored := true;
                INSERT INTO ignored_payments (source, payment_id, event_id) VALUES (p_source, p_payment, p_event_id)
                ON CONFLICT (source, payment_id) DO NOTHING;
            END IF;
        END IF;
    END IF;
    IF problem IS NULL AND p_kind = 'credit' THEN
        -- The payment's key first: a twin announcing the same payment waits
        -- on this insert, then finds it taken. Then the user's row.
        INSERT INTO payments (source, payment_id, user_id, amount_cents, currency, event_id, customer_id)
        SELECT p_source, p_payment, v_user, p_amount, p_currency, p_event_id, CASE WHEN v_linked THEN p_customer END
        WHERE EXISTS (SELECT 1 FROM user_balances WHERE user_id = v_user)
        ON CONFLICT (source, payment_id) DO NOTHING;
        IF FOUND THEN
            UPDATE user_balances SET balance_cents = balance_cents + p_amount, updated_at = now()
            WHERE user_id = v_user AND balance_cents <= 9223372036854775807 - p_amount
            RETURNING user_balances.balance_cents INTO balance_after;
            IF FOUND THEN
                INSERT INTO ledger_journal (source, event_id, kind, payment_id, user_id, amount_cents)
                VALUES (p_source, p_event_id, 'credit', p_payment, v_user, p_amount);
                DELETE FROM ignored_payments WHERE source = p_source AND payment_id = p_payment;
                change := 'credit';
            ELSE
                DELETE FROM payments WHERE source = p_source AND payment_id = p_payment;
                problem := 'credit would overflow the balance';
            END IF;
        ELSE
            SELECT * INTO v_payment FROM payments WHERE source = p_source AND payment_id = p_payment;
            IF NOT FOUND THEN
                problem := 'unknown user ' || v_user;
            ELSIF (v_payment.user_id, v_payment.amount_cents, v_payment.currency) = (v_user, p_amount, p_currency)
            THEN
                change := 'payment_duplicate';
            ELSE
                v_mismatch := true;
                problem := format('payment %s was credited by event %s with another user, amount or currency',
                                  p_payment, v_payment.event_id);
            END IF;
        END IF;
    ELSIF problem IS NULL THEN
        -- A movement of a credited payment: its row serialises them all.
        SELECT * INTO v_payment FROM payments WHERE source = p_source AND payment_id = p_payment FOR UPDATE;
        IF NOT FOUND THEN
            problem := 'unknown payment ' || p_payment;
            IF EXISTS (SELECT 1 FROM ignored_payments i WHERE i.source = p_source AND i.payment_id = p_payment) THEN
                v_ignored := true;  -- a payment that is not ours: nobody's to debit
                problem := format('payment %s is not ours: it named no user, and was ignored', p_payment);
            END IF;
        ELSIF v_payment.currency <> p_currency THEN
            problem := format('%s in %s of payment %s, which was in %s', CASE p_kind WHEN 'dispute' THEN 'dispute'
                              ELSE 'refund' END, p_currency, p_payment, v_payment.currency);
        ELSIF p_amount > v_payment.amount_cents THEN
            problem := CASE WHEN p_kind = 'refunded_total'
                            THEN format('refunded total of %s cents is above payment %s''s %s cents',
                                        p_amount, p_payment, v_payment.amount_cents)
                            ELSE format('%s %s of %s cents is above payment %s''s %s cents',
                                        p_kind, p_movement, p_amount, p_payment, v_payment.amount_cents) END;
        ELSIF p_kind = 'refunded_total' THEN
            IF p_amount > v_payment.refunded_cents THEN
                UPDATE payments SET refunded_cents = p_amount WHERE source = p_source AND payment_id = p_payment;
            END IF;  -- else a total already seen (late, repeated, out of order)
        ELSE
            INSERT INTO movements (source, kind, movement_id, payment_id, amount_cents, state, event_id)
            VALUES (p_source, p_kind, p_movement, p_payment, p_amount, p_state, p_event_id)
            ON CONFLICT (source, kind, movement_id) DO NOTHING;
            IF NOT FOUND THEN
                SELECT * INTO v_movement FROM movements
                WHERE source = p_source AND kind = p_kind AND movement_id = p_movement FOR UPDATE;
                IF (v_movement.payment_id, v_movement.amount_cents) <> (p_payment, p_amount) THEN
                    v_mismatch := true;
                    problem := format('%s %s was announced by event %s with another payment or amount',
                                      p_kind, p_movement, v_movement.event_id);
                ELSIF v_movement.state = 'applied' AND p_state = 'reversed' THEN
                    UPDATE movements SET state = 'reversed', updated_at = now()
                    WHERE source = p_source AND kind = p_kind AND movement_id = p_movement;
                END IF;  -- else seen in this state, or a later one, already
            END IF;
        END IF;
        IF problem IS NULL THEN
            SELECT a.debit_due_cents INTO v_due FROM payment_accounts a
            WHERE a.source = p_source AND a.payment_id = p_payment;
            IF v_due <> v_payment.debited_cents THEN
                -- Named by what the event says; the journal's CHECK refuses
                -- a sign that disagrees (the rule only grows `due` for an
                -- applied movement or a total, only shrinks it for a reversal).
                change := CASE WHEN p_kind = 'dispute' AND p_state = 'applied' THEN 'dispute_withdrawn'
                               WHEN p_kind = 'dispute' THEN 'dispute_reinstated'
                               WHEN p_state = 'reversed' THEN 'refund_reversed'
                               ELSE 'refund' END;
                UPDATE payments SET debited_cents = v_due, updated_at = now()
                WHERE source = p_source AND payment_id = p_payment;
                UPDATE user_balances SET balance_cents = balance_cents - (v_due - v_payment.debited_cents),
                                         updated_at = now()
                WHERE user_id = v_payment.user_id RETURNING balance_cents INTO balance_after;
                INSERT INTO ledger_journal (source, event_id, kind, payment_id, movement_id, user_id, amount_cents)
                VALUES (p_source, p_event_id, change, p_payment, p_movement, v_payment.user_id,
                        v_payment.debited_cents - v_due);
            END IF;
        END IF;
    END IF;

    -- Complete, or record why not.
    IF problem IS NULL THEN
        IF NOT v_new THEN  -- a failed event's retry; a new one was inserted completed
            UPDATE webhook_events SET status = 'completed', completed_at = now(), updated_at = now(),
                                      last_error = NULL
            WHERE id = v_row_id;
        END IF;
        outcome := CASE WHEN change = 'payment_duplicate' THEN 'duplicate' ELSE 'processed' END;
    ELSIF v_ignored THEN
        UPDATE webhook_events SET status = 'ignored', completed_at = NULL, last_error = problem, updated_at = now()
        WHERE id = v_row_id;
        outcome := 'ignored';
    ELSE
        UPDATE webhook_events SET status = 'failed', completed_at = NULL, last_error = problem, updated_at = now()
        WHERE id = v_row_id;
        outcome := CASE WHEN v_mismatch THEN 'payment_mismatch' ELSE 'failed' END;
    END IF;
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
-- A balance may not go below zero unless p_allow_negative (then it may,
-- within BIGINT's range). A second call with the same reference, user and
-- amount changes nothing and returns the first call's row, outcome
-- 'duplicate'; with another user or amount it is refused (23505). A refused
-- call records nothing: its reference may be tried again. Returns the
-- outcome ('spent' or 'duplicate'), the spend's journal row and when it was
-- made, and the user's balance as the call leaves it (on a duplicate, the
-- balance now).
CREATE OR REPLACE FUNCTION spend(p_user uuid, p_cents bigint, p_reference text, p_allow_negative boolean DEFAULT false,
                                 OUT outcome text, OUT journal_id bigint, OUT spent_at timestamptz,
                                 OUT balance_cents bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_first ledger_journal%ROWTYPE;
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
    IF balance_cents < p_cents AND NOT coalesce(p_allow_negative, false) THEN
        RAISE EXCEPTION 'the balance of user % is % cents: spending % would take it below zero',
                        p_user, balance_cents, p_cents USING ERRCODE = 'check_violation';
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
