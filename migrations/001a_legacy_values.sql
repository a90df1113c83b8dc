-- 001a: credits that 002 cannot file as their events say. Named to sort
-- between 001 and 002: on a database of a release before payments it runs
-- just before 002, and sets aside what 002 would refuse or misfile; on any
-- other database (002 ran there already) it only creates its table.
--
-- The first release read neither data.paymentId nor a currency, and the
-- release before payments not data.paymentId: they credited events whose
-- payment id or currency 002's CHECKs refuse ("", over 128 characters,
-- "US$"), which stopped 002, or that today's rule refuses (a number, null),
-- which `flask ledger verify` then reported for good. Such an event's row is
-- moved here whole, so that 002 files its credit under its event id, in the
-- ledger's currency, and no rule reads its values again (a re-delivery is a
-- duplicate, by its journal row). A credit whose event was purged already is
-- recorded here too (no row is left to move): 002 files it under its event
-- id, which a provider does not refund by (a Stripe PaymentIntent's is
-- another). The money stays credited either way. `flask init-db` then files
-- each under the valid payment id or currency its event named, if any, and
-- prints one line per row, saying why and what to do (app/legacy.py).
CREATE TABLE IF NOT EXISTS legacy_set_aside (
    source             TEXT NOT NULL,
    event_id           TEXT NOT NULL,
    refused_payment_id JSONB,        -- the payment id the event named, which the ledger refuses (JSON: null, 42, "")
    refused_currency   JSONB,        -- the currency the event named, which the ledger refuses
    payment_id         TEXT,         -- the valid payment id the event named, to file the credit under
    currency           TEXT,         -- the valid currency the event named, to file the credit in
    -- The event's row as it was stored; NULL for an event purged before the upgrade.
    event_type         TEXT,
    body               BYTEA,
    payload            JSONB,
    payload_sha256     BYTEA,
    received_at        TIMESTAMPTZ,
    set_aside_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    settled_at         TIMESTAMPTZ,  -- when `flask init-db` filed it and printed its line
    PRIMARY KEY (source, event_id)
);

DO $$
BEGIN
    IF to_regclass('ledger_credits') IS NULL THEN
        RETURN;  -- 002 ran here already: nothing of what it reads is left to set aside
    END IF;
    INSERT INTO legacy_set_aside (source, event_id)
    SELECT c.source, c.event_id FROM ledger_credits c
    WHERE NOT EXISTS (SELECT FROM webhook_events e WHERE e.source = c.source AND e.event_id = c.event_id);

    -- Each credited event's payment id and currency where today's rule reads
    -- them (events.RULES), and the currency as 002 reads it. A payment id is
    -- a string of 1-128 characters (jsonb holds no NUL), a currency three
    -- letters; payment.succeeded may omit either (the event is its payment;
    -- the ledger's currency).
    WITH sent AS (
        SELECT e.*,
               CASE e.event_type WHEN 'payment_intent.succeeded' THEN e.payload #> '{data,object,id}'
                                 ELSE e.payload #> '{data,paymentId}' END AS sent_id,
               CASE e.event_type WHEN 'payment_intent.succeeded' THEN e.payload #> '{data,object,currency}'
                                 ELSE e.payload #> '{data,currency}' END AS sent_currency,
               lower(coalesce(e.payload #>> '{data,currency}', e.payload #>> '{data,object,currency}')) AS read_by_002
        FROM webhook_events e JOIN ledger_credits c USING (source, event_id)
    ), judged AS (
        SELECT *,
               jsonb_typeof(sent_id) = 'string' AND char_length(sent_id #>> '{}') BETWEEN 1 AND 128 AS valid_id,
               jsonb_typeof(sent_currency) = 'string' AND lower(sent_currency #>> '{}') ~ '^[a-z]{3}$'
                   AS valid_currency,
               event_type = 'payment_intent.succeeded' AS required
        FROM sent
    ), refused AS (
        SELECT *,
               NOT coalesce(valid_id, NOT required) AS refused_id,
               NOT (coalesce(valid_currency, NOT required) AND coalesce(read_by_002 ~ '^[a-z]{3}$', true))
                   AS refused_currency
        FROM judged
    )
    INSERT INTO legacy_set_aside (source, event_id, refused_payment_id, refused_currency, payment_id, currency,
                                  event_type, body, payload, payload_sha256, received_at)
    SELECT source, event_id,
           CASE WHEN refused_id THEN coalesce(sent_id, 'null') END,
           CASE WHEN refused_currency THEN coalesce(sent_currency, 'null') END,
           CASE WHEN valid_id THEN sent_id #>> '{}' END,
           CASE WHEN valid_currency THEN lower(sent_currency #>> '{}') END,
           event_type, body, payload, payload_sha256, created_at
    FROM refused
    WHERE refused_id OR refused_currency;
    DELETE FROM webhook_events e USING legacy_set_aside s
    WHERE e.source = s.source AND e.event_id = s.event_id AND s.event_type IS NOT NULL;
END
$$;
