-- Stripe Connect: a connected account's money is keyed in its account
-- (acct_X/pi_Y, acct_X/re_Y, acct_X/du_Y; its customers acct_X/cus_Y), and
-- apply_event reads the account (ledger_delivery's new attribute: money.sql
-- creates the type again, and the functions that take it). Release 1.0
-- keyed a connected account's payments as the platform's (pi_Y): their rows
-- are rewritten here, in every table that holds a payment's or a
-- movement's key but the journal (append-only: its rows keep their keys,
-- and 012_journal_payment_moves.sql records each such payment's move), so
-- that a later refund or dispute of one finds its
-- payment and never debits it twice. A payment's account is read from the
-- stored bytes of record of its events (a snapshot event's `account`, a
-- thin event's `context`); a payment none of whose events is stored any
-- more (purged) keeps its key. Effect version 7: `flask init-db`
-- recomputes, after this, the stored effects of rows of another version.
-- IF EXISTS: the commit tagged 1.0.0 applied the rule before the type
-- (its apply_event took scalars); the builds after it that still said
-- 1.0.0 created it (schema.py's SUPERSEDED says why this file's text
-- before is still accepted).
DROP TYPE IF EXISTS ledger_delivery CASCADE;
ALTER TABLE webhook_events ALTER COLUMN effect_version SET DEFAULT 7;

-- What each stored Stripe event names: its account (NULL: the platform's),
-- its payment and its customer, bare (a thin event's from its related
-- object, kept as fetched). Only bytes that name an account or a context
-- are parsed.
CREATE TEMPORARY TABLE connect_named ON COMMIT DROP AS
SELECT
    e.id,
    e.source,
    e.event_id,
    CASE WHEN e.doc ->> 'object' = 'v2.core.event' THEN substring(e.doc ->> 'context' FROM '([^/]+)$')
         ELSE e.doc ->> 'account' END AS account,
    CASE WHEN e.doc ->> 'object' = 'v2.core.event' AND e.doc -> 'related_object' ->> 'type' = 'payment_intent'
             THEN e.doc -> 'related_object' ->> 'id'
         WHEN e.doc ->> 'object' = 'v2.core.event' THEN e.obj ->> 'payment_intent'
         WHEN e.event_type = 'payment_intent.succeeded' THEN e.obj ->> 'id'
         ELSE e.obj ->> 'payment_intent' END AS payment_id,
    e.obj ->> 'customer' AS customer_id
FROM (
    SELECT
        w.id,
        w.source,
        w.event_id,
        w.event_type,
        j.doc,
        CASE WHEN j.doc ->> 'object' = 'v2.core.event' THEN event_json(w.fetched)
             ELSE j.doc -> 'data' -> 'object' END AS obj
    FROM webhook_events AS w
    CROSS JOIN LATERAL (SELECT event_json(w.body) AS doc) AS j
    WHERE position('"account"'::bytea IN w.body) > 0 OR position('"context"'::bytea IN w.body) > 0
) AS e
WHERE e.doc ->> 'object' IN ('event', 'v2.core.event');
UPDATE connect_named SET account = NULL
WHERE account !~ '^acct_[A-Za-z0-9]+$';

-- Each connected account's payment: the account of the event that credited
-- it, when stored (a platform's event: the payment stays the platform's),
-- else of its first stored event. A payment whose key, or one of whose
-- movements' keys, would be over 128 characters in its account keeps its
-- bare keys, whole: the live rule refuses such a key (422), and a CHECK
-- would stop the upgrade.
CREATE TEMPORARY TABLE connect_payments ON COMMIT DROP AS
SELECT
    source,
    payment_id,
    account
FROM (
    SELECT DISTINCT ON (n.source, n.payment_id)
        n.source,
        n.payment_id,
        n.account
    FROM connect_named AS n
    LEFT JOIN payments AS p ON (p.source, p.payment_id) = (n.source, n.payment_id)
    WHERE n.payment_id IS NOT NULL
    ORDER BY n.source ASC, n.payment_id ASC, n.event_id IS NOT DISTINCT FROM p.event_id DESC, n.id ASC
) AS first_named
WHERE account IS NOT NULL
    AND char_length(payment_id) BETWEEN 1 AND 127 - char_length(account)
    AND NOT EXISTS (
        SELECT FROM movements AS m
        WHERE
            (m.source, m.payment_id) = (first_named.source, first_named.payment_id)
            AND char_length(m.movement_id) > 127 - char_length(first_named.account)
    );

-- A connected account's customers, linked bare: the link, copied in the
-- account (1.0 read the bare link for them; it stays, for the platform's).
INSERT INTO customer_links (source, customer_id, user_id, linked_by, created_at)
SELECT DISTINCT ON (l.source, n.account, l.customer_id)
    l.source,
    n.account || '/' || l.customer_id AS customer_id,
    l.user_id,
    l.linked_by,
    l.created_at
FROM (
    SELECT
        source,
        account,
        customer_id
    FROM connect_named
    WHERE account IS NOT NULL
    UNION
    SELECT
        p.source,
        c.account,
        p.customer_id
    FROM payments AS p INNER JOIN connect_payments AS c ON (p.source, p.payment_id) = (c.source, c.payment_id)
) AS n
INNER JOIN customer_links AS l ON (l.source, l.customer_id) = (n.source, n.customer_id)
WHERE char_length(l.customer_id) <= 127 - char_length(n.account)
ON CONFLICT (source, customer_id) DO NOTHING;

-- The keys, in their account: movements refer to payments, so their
-- foreign key is dropped while both change, then checked again whole.
ALTER TABLE movements DROP CONSTRAINT movements_source_payment_id_fkey;
UPDATE payments AS p
SET payment_id = c.account || '/' || p.payment_id,
    customer_id = c.account || '/' || p.customer_id
FROM connect_payments AS c
WHERE (p.source, p.payment_id) = (c.source, c.payment_id);
UPDATE movements AS m
SET payment_id = c.account || '/' || m.payment_id,
    movement_id = c.account || '/' || m.movement_id
FROM connect_payments AS c
WHERE (m.source, m.payment_id) = (c.source, c.payment_id);
ALTER TABLE movements ADD CONSTRAINT movements_source_payment_id_fkey
FOREIGN KEY (source, payment_id) REFERENCES payments (source, payment_id);
UPDATE payment_users AS a
SET payment_id = c.account || '/' || a.payment_id
FROM connect_payments AS c
WHERE (a.source, a.payment_id) = (c.source, c.payment_id);
UPDATE ignored_payments AS i
SET payment_id = c.account || '/' || i.payment_id
FROM connect_payments AS c
WHERE (i.source, i.payment_id) = (c.source, c.payment_id);
