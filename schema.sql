-- webhook-ledger schema: the current tables, whole; the file to read. Needs
-- PostgreSQL 14 or later (CREATE OR REPLACE TRIGGER). The money rule (the
-- functions and the view that apply and account for every movement) is in
-- money.sql, beside this file.
--
-- `flask init-db` (app/store/schema.py) runs it on an empty database, as release
-- 1.0.0 plus every file of migrations/. A database created by an earlier
-- release gets the migrations it lacks instead, in order. Either way
-- money.sql is then applied again, whole. So a change to a table is made
-- twice: here, and in a new migrations/NNN_what.sql that takes a database at
-- the previous version to it (a migration, once released, never changes); a
-- change to the rule is made once, in money.sql. tests/test_db.py checks that
-- both ways end in the same tables, constraints, indexes and functions.
--
-- Ids: a provider's (an event's, a Stripe account's) is 1 to 255 characters,
-- Stripe's documented bound for the ids it generates; a payment's, a
-- movement's or a customer's key 1 to 511, room for a Stripe connected
-- account's acct_X/pi_Y (app/core/vocabulary.py's MAX_ID_CHARS and
-- MAX_KEY_CHARS). The CHECKs on them are named: migrations replace them.

-- The ledger's currency: the one row that the first `flask init-db` records
-- (its LEDGER_CURRENCY). Every balance and every credited payment is in it;
-- init-db and the service refuse another LEDGER_CURRENCY, and `flask ledger
-- set-currency` changes it only while nothing has moved.
CREATE TABLE IF NOT EXISTS ledger_currency (
    one         BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    currency    TEXT NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The ledger: one row per user, credited by payments, debited by their
-- refunds and disputes and by what the user spends, and corrected by
-- operators' adjustments. The opening balance is the balance the row was created with (set
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
-- tries again). A row is inserted in the state it most likely ends in
-- (money.sql's apply_event).
CREATE TABLE IF NOT EXISTS webhook_events (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- 'default' for POST /api/webhooks, else a name from WEBHOOK_SOURCES.
    source           TEXT NOT NULL DEFAULT 'default' CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    event_id         TEXT NOT NULL CONSTRAINT webhook_events_event_id_check
                          CHECK (char_length(event_id) BETWEEN 1 AND 255),
    event_type       TEXT NOT NULL CHECK (char_length(event_type) BETWEEN 1 AND 64),
    -- 'ignored': a payment that names no user (no metadata, no linked
    -- customer) under its source's WEBHOOK_<NAME>_NO_USER=ignore, or a refund
    -- or dispute of one: answered 2xx, nothing applied, `flask events replay`
    -- applies it once a link names its user. 'dismissed': a failed event that
    -- an operator closed (`flask events dismiss`), with why, who and when.
    status           TEXT NOT NULL CHECK (status IN ('completed', 'failed', 'ignored', 'dismissed')),
    -- The exact bytes received: the event of record, which replay and
    -- verify parse (the view webhook_events_json shows them as jsonb).
    body             BYTEA NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 1 CHECK (attempts >= 1),
    last_error       TEXT,                    -- why the last attempt failed, while it is failed
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at     TIMESTAMPTZ,
    -- SHA-256 of body.
    payload_sha256   BYTEA NOT NULL CHECK (octet_length(payload_sha256) = 32),
    -- SHA-256 of the event's effect (vocabulary.Effect.sha256): a later
    -- delivery of the id with another effect is refused (409
    -- payload_mismatch) and only counted; the same effect in other bytes is
    -- the same event. NULL only on a row whose stored bytes do not parse
    -- (its bytes are compared).
    effect_sha256    BYTEA CHECK (octet_length(effect_sha256) = 32),
    -- The rule that effect_sha256 was computed by (events.EFFECT_VERSION):
    -- `flask init-db` recomputes, from the stored bytes, the effects of rows
    -- stored under another, so that re-deliveries compare alike.
    effect_version   SMALLINT DEFAULT 9,
    -- The settings its outcome was decided under (LEDGER_CURRENCY,
    -- STRIPE_ACCEPT_TEST_EVENTS): `flask ledger verify` judges it by them,
    -- not by today's. No CHECK:
    -- the value is a parsed setting, and PostgreSQL reads each CHECK anew on
    -- every insert and update of this, the hottest table.
    ledger_currency  TEXT,
    test_events_accepted BOOLEAN,
    -- Per source, as decided under: the metadata key read for the user
    -- (WEBHOOK_<NAME>_USER_METADATA_KEY) and what a payment with no user got
    -- (WEBHOOK_<NAME>_NO_USER: 'refuse' or 'ignore').
    user_metadata_key TEXT,
    no_user          TEXT,
    dismissed_reason TEXT CHECK (dismissed_reason ~ '\S' AND char_length(dismissed_reason) <= 500),
    dismissed_by     TEXT CHECK (char_length(dismissed_by) BETWEEN 1 AND 128),
    dismissed_at     TIMESTAMPTZ,
    mismatches       INTEGER NOT NULL DEFAULT 0 CHECK (mismatches >= 0),
    last_mismatch_at TIMESTAMPTZ,
    -- Where its bytes of record came from: 'delivery' (a webhook received),
    -- or 'reconcile' (`flask reconcile` found it in the provider's event list
    -- and stored the Event object's JSON: a delivery that was lost).
    origin           TEXT NOT NULL DEFAULT 'delivery' CHECK (origin IN ('delivery', 'reconcile')),
    -- The event as its provider's API returned it, under a source that
    -- fetches each event (app/providers/: always under paypal, whose
    -- signature covers only a CRC32 of the body): what its money was read
    -- from, and what replay and verify read. body stays the notification of
    -- record. NULL for every other source, and when the provider had no
    -- record of the event (failed, effect_sha256 all zeros: any later effect
    -- of the id replaces it, money.sql).
    fetched          BYTEA,
    CONSTRAINT webhook_events_source_event_id_key UNIQUE (source, event_id)
);

-- Operators look for failed events.
CREATE INDEX IF NOT EXISTS webhook_events_status_idx
    ON webhook_events (status) WHERE status <> 'completed';
-- `flask events list` shows the newest first and `flask events purge`
-- deletes the oldest, both in the primary key's order (ids grow with
-- arrival); this finds where a time begins (`--since`, purge's cutoff) with
-- one summary per 128 pages, which a new event's insert does not write.
CREATE INDEX IF NOT EXISTS webhook_events_created_at_brin
    ON webhook_events USING brin (created_at) WITH (autosummarize = on);

-- The body as jsonb, for an operator's queries, computed when read. NULL
-- where jsonb cannot hold the body (\u0000, a lone surrogate escape, a
-- number beyond numeric's range): such an event is stored and applied from
-- its bytes all the same, and a sanitised copy would show values that were
-- not sent.
CREATE OR REPLACE FUNCTION event_json(p_body BYTEA) RETURNS JSONB LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN convert_from(p_body, 'UTF8')::jsonb;
EXCEPTION WHEN data_exception THEN  -- class 22: not UTF-8, or not a value jsonb holds
    RETURN NULL;
END
$$;
CREATE OR REPLACE VIEW webhook_events_json AS
SELECT
    id,
    source,
    event_id,
    event_type,
    status,
    created_at,
    completed_at,
    last_error,
    event_json(body) AS payload
FROM webhook_events;

-- One row per payment credited, per source. Its primary key is what
-- "a payment is credited at most once" rests on, as webhook_events' unique
-- constraint is for events: however many events announce one payment, in
-- whatever order or concurrency, one insert wins. Every movement of the
-- payment locks this row first. refunded_cents is the highest running total
-- of refunds seen (Stripe's charge.refunded, payment.refunded); debited_cents
-- what its refunds and disputes take from its user now, as money.sql's
-- payment_accounts computes it.
CREATE TABLE IF NOT EXISTS payments (
    source         TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    -- The provider's payment: a Stripe PaymentIntent's id (a connected
    -- account's as acct_X/pi_Y: Connect, keys of two accounts never
    -- collide), a payment's data.paymentId, or the id of the event that
    -- credited it.
    payment_id     TEXT NOT NULL CONSTRAINT payments_payment_id_check
                        CHECK (char_length(payment_id) BETWEEN 1 AND 511),
    user_id        UUID NOT NULL REFERENCES user_balances (user_id),
    amount_cents   BIGINT NOT NULL CHECK (amount_cents > 0),
    currency       TEXT NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    refunded_cents BIGINT NOT NULL DEFAULT 0 CHECK (refunded_cents BETWEEN 0 AND amount_cents),
    debited_cents  BIGINT NOT NULL DEFAULT 0 CHECK (debited_cents BETWEEN 0 AND amount_cents),
    event_id       TEXT NOT NULL,             -- the event whose delivery credited it
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The customer (or the Stripe connected account) whose link
    -- (customer_links) named user_id; NULL: the event's metadata named it.
    customer_id    TEXT,
    PRIMARY KEY (source, payment_id)
);

-- The application's own key of a user -> the user (money.sql's
-- add_user_key): an integer's digits or a text key, which the application
-- passes to user_of() in its calls, and puts in a payment's metadata instead
-- of the user's UUID. One per user; never changed nor deleted, so that a
-- credit made through a key is checked against it (`flask ledger verify`).
CREATE TABLE IF NOT EXISTS user_keys (
    app_key    TEXT PRIMARY KEY CHECK (char_length(app_key) BETWEEN 1 AND 255),
    user_id    UUID NOT NULL UNIQUE REFERENCES user_balances (user_id),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- A provider's customer -> the user its payments credit when their metadata
-- names none (`flask users link`): Stripe's cus_Y, a connected account's
-- customer acct_X/cus_Y, or a whole connected account acct_X (read after
-- its customer's link). Never changed nor deleted once made, so
-- that a credit made through a link is checked against it (`flask ledger
-- verify`) and no link moves a payment already credited.
CREATE TABLE IF NOT EXISTS customer_links (
    source      TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    customer_id TEXT NOT NULL CONSTRAINT customer_links_customer_id_check
                     CHECK (char_length(customer_id) BETWEEN 1 AND 511),
    user_id     UUID NOT NULL REFERENCES user_balances (user_id),
    linked_by   TEXT NOT NULL CHECK (char_length(linked_by) BETWEEN 1 AND 128),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, customer_id)
);
CREATE INDEX IF NOT EXISTS customer_links_user_idx ON customer_links (user_id);

-- A payment -> the user it credits when none of its events names one and its
-- customer is linked to none: an operator's answer (`flask payments
-- assign-user`), read by money.sql's credit_payment after the link. Never
-- changed nor deleted, as a link: a payment credited before it is not moved.
CREATE TABLE IF NOT EXISTS payment_users (
    source      TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    payment_id  TEXT NOT NULL CONSTRAINT payment_users_payment_id_check
                     CHECK (char_length(payment_id) BETWEEN 1 AND 511),
    user_id     UUID NOT NULL REFERENCES user_balances (user_id),
    assigned_by TEXT NOT NULL CHECK (char_length(assigned_by) BETWEEN 1 AND 128),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, payment_id)
);

-- Payments that named no user (no metadata, no linked customer) under their
-- source's `ignore`: their refunds and disputes are ignored too, never
-- applied to anyone. A credit made later (a replay after a link) deletes it.
CREATE TABLE IF NOT EXISTS ignored_payments (
    source     TEXT NOT NULL,
    payment_id TEXT NOT NULL,
    event_id   TEXT NOT NULL,             -- the event whose payment was ignored
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, payment_id)
);

-- One row per movement of a payment that has its own identity at the
-- provider: a refund object (kind 'refund', Stripe's re_..., a connected
-- account's acct_X/re_...) or a dispute (kind 'dispute'). Its primary key is what "each movement applies once"
-- rests on. state only moves forward: 'applied' (a refund seen counted, a
-- dispute's funds withdrawn) then 'reversed' (a refund seen failed or
-- canceled, a dispute's funds reinstated); a movement first seen reversed is
-- never applied. The amount is what the movement takes from the payment.
CREATE TABLE IF NOT EXISTS movements (
    source       TEXT NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('refund', 'dispute')),
    movement_id  TEXT NOT NULL CONSTRAINT movements_movement_id_check
                      CHECK (char_length(movement_id) BETWEEN 1 AND 511),
    payment_id   TEXT NOT NULL,
    amount_cents BIGINT NOT NULL CHECK (amount_cents > 0),
    state        TEXT NOT NULL CHECK (state IN ('applied', 'reversed')),
    event_id     TEXT NOT NULL,               -- the event that first announced it
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, kind, movement_id),
    FOREIGN KEY (source, payment_id) REFERENCES payments (source, payment_id)
);
-- A payment's account sums its movements (money.sql's payment_accounts).
CREATE INDEX IF NOT EXISTS movements_payment_idx ON movements (source, payment_id);

-- The ledger's journal, append-only: one row per
-- balance change, written in the transaction that changes user_balances. A
-- row an event wrote names its event and its payment and, for a refund
-- object or a dispute, its movement (NULL for a credit and for a running
-- total); its kind says which way the money went: a 'credit' or a
-- 'refund_reversed' or 'dispute_reinstated' (amount > 0), a 'refund' or a
-- 'dispute_withdrawn' (amount < 0). It
-- outlives the webhook_events row (purge keeps it; hence no foreign key),
-- and its UNIQUE (source, event_id) (one balance change per event) stops an
-- event whose row was purged from being applied again, or marked failed,
-- if it is redelivered. A row that no event wrote (money.sql's adjust and
-- spend) names no event and no movement: an 'adjustment' (an operator's
-- correction, either sign, never 0) names its reason and who made it, and
-- the payment whose credit it corrects, if any; a 'spend' (amount < 0: the
-- application spent the user's credit, or captured a hold) names the
-- reference the application gave, and a 'give_back' (amount > 0: a spend
-- given back) the reference of the spend it gives back. The unique index on
-- (reference, kind) (spends and give-backs only: an event's row, most of the
-- journal, costs that index nothing) is what makes one spend apply once,
-- and its give-back once, however often either is asked for.
CREATE TABLE IF NOT EXISTS ledger_journal (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source       TEXT CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    event_id     TEXT CONSTRAINT ledger_journal_event_id_check
                      CHECK (char_length(event_id) BETWEEN 1 AND 255),
    user_id      UUID NOT NULL REFERENCES user_balances (user_id),
    amount_cents BIGINT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    kind         TEXT NOT NULL,
    payment_id   TEXT CONSTRAINT ledger_journal_payment_id_check
                      CHECK (char_length(payment_id) BETWEEN 1 AND 511),
    movement_id  TEXT,
    reference    TEXT CHECK (char_length(reference) BETWEEN 1 AND 128),  -- a spend's, given by the application
    reason       TEXT CHECK (reason ~ '\S' AND char_length(reason) <= 500),  -- why an adjustment was made
    actor        TEXT CHECK (char_length(actor) BETWEEN 1 AND 128),  -- who made an adjustment
    -- The writing transaction's id: what the change feed (money.sql's
    -- journal_changes) orders and bounds commits by.
    xid          XID8 NOT NULL DEFAULT pg_current_xact_id(),
    -- A 'payment_moved' row's: the key the payment had before it was keyed
    -- in a connected account (payment_id, its key since). The rows written
    -- under that key before it keep it: read them through
    -- ledger_journal_keyed (money.sql).
    moved_from   TEXT CONSTRAINT ledger_journal_moved_from_check
                      CHECK (char_length(moved_from) BETWEEN 1 AND 511),
    CONSTRAINT ledger_journal_kind_check
        CHECK (kind IN ('credit', 'refund_reversed', 'dispute_reinstated', 'give_back') AND amount_cents > 0
               OR kind IN ('refund', 'dispute_withdrawn', 'spend') AND amount_cents < 0
               OR kind = 'adjustment' AND amount_cents <> 0
               OR kind = 'payment_moved' AND amount_cents = 0),
    -- What each kind of row names, and nothing else.
    CONSTRAINT ledger_journal_names_check
        CHECK (CASE kind
               WHEN 'adjustment' THEN num_nonnulls(event_id, movement_id, reference, moved_from) = 0
                                      AND num_nonnulls(source, payment_id) IN (0, 2) AND num_nonnulls(reason, actor) = 2
               WHEN 'spend' THEN num_nonnulls(source, event_id, payment_id, movement_id, reason, actor, moved_from) = 0
                                 AND reference IS NOT NULL
               WHEN 'give_back' THEN num_nonnulls(source, event_id, payment_id, movement_id, reason, actor,
                                                  moved_from) = 0
                                     AND reference IS NOT NULL
               WHEN 'payment_moved' THEN num_nonnulls(source, payment_id, moved_from, actor) = 4
                                         AND num_nonnulls(event_id, movement_id, reference, reason) = 0
               ELSE num_nonnulls(source, event_id, payment_id) = 3
                    AND num_nonnulls(reference, reason, actor, moved_from) = 0
               END),
    CONSTRAINT ledger_journal_source_event_id_key UNIQUE (source, event_id)
);
CREATE INDEX IF NOT EXISTS ledger_journal_user_idx ON ledger_journal (user_id);
CREATE INDEX IF NOT EXISTS ledger_journal_xid_idx ON ledger_journal (xid, id);
-- A key is moved once at most: a bare payment credited again after its move
-- is another payment, which stays the platform's.
CREATE UNIQUE INDEX IF NOT EXISTS ledger_journal_moved_from_key ON ledger_journal (source, moved_from)
    WHERE moved_from IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS ledger_journal_reference_key ON ledger_journal (reference, kind)
    WHERE reference IS NOT NULL;

-- One row per hold the application places on a user's credit (money.sql's
-- place_hold, capture_hold, release_hold), keyed by the application's
-- reference, which is also the reference of the spend its capture writes.
-- 'held' counts against the user's available balance until expires_at
-- (read as now() < expires_at: no sweeper needed); 'captured' names the
-- spend's journal row and what it took (up to the hold's amount);
-- 'released' took nothing. Refunds and disputes never read it.
CREATE TABLE IF NOT EXISTS holds (
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
-- A user's active holds, summed by every place_hold and spend of the user.
CREATE INDEX IF NOT EXISTS holds_held_idx ON holds (user_id) WHERE state = 'held';

-- One row per `flask reconcile` run: the window it listed ([since, until),
-- by the events' own creation time at the provider), what it found, and how
-- it ended. 'running' only while it runs: a run killed midway is marked
-- 'interrupted' by the next run of its source and account, which holds their
-- watermark row, so none can be running. A dry run records nothing.
CREATE TABLE IF NOT EXISTS reconcile_runs (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source      TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    -- Whose events it listed: a Stripe Connect account (`--account`), or ''
    -- for the platform's own (the API key's) account.
    account     TEXT NOT NULL DEFAULT '' CONSTRAINT reconcile_runs_account_check
                     CHECK (account = '' OR account ~ '^acct_[A-Za-z0-9]{1,250}$'),
    since       TIMESTAMPTZ NOT NULL,
    until       TIMESTAMPTZ NOT NULL,
    -- 'completed': every event of the window listed and applied (or refused,
    -- counted); 'incomplete': part of the window was beyond what the
    -- provider lists (its horizon), never reported as done; 'failed': the
    -- provider refused the key or stayed unavailable; 'yielded': another run
    -- of the source held it.
    status      TEXT NOT NULL DEFAULT 'running'
                CHECK (status IN ('running', 'completed', 'incomplete', 'failed', 'interrupted', 'yielded')),
    pages       INTEGER NOT NULL DEFAULT 0 CHECK (pages >= 0),
    listed      INTEGER NOT NULL DEFAULT 0 CHECK (listed >= 0),
    applied     INTEGER NOT NULL DEFAULT 0 CHECK (applied >= 0),    -- recovered: stored or completed by this run
    duplicates  INTEGER NOT NULL DEFAULT 0 CHECK (duplicates >= 0),  -- already applied (delivered, or reconciled)
    refused     INTEGER NOT NULL DEFAULT 0 CHECK (refused >= 0),     -- 422 or 409, recorded on the event
    message     TEXT,                                                 -- how it ended, in one line
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ
);
-- The metrics read each source's and account's last successful run.
CREATE INDEX IF NOT EXISTS reconcile_runs_source_idx ON reconcile_runs (source, account, status, finished_at);

-- Per source and account (reconcile_runs.account), where the last complete
-- run got to: the next run without --since starts there, minus an overlap.
-- Its row is also the run lock of the source's account: a run holds it FOR
-- UPDATE for as long as it runs (one transaction left open), so a second run
-- at the same time yields, and a killed run frees it with its connection.
-- The metrics' last success of a source is that of its account reconciled
-- least recently among those with a row here.
CREATE TABLE IF NOT EXISTS reconcile_watermarks (
    source           TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    account          TEXT NOT NULL DEFAULT '' CONSTRAINT reconcile_watermarks_account_check
                          CHECK (account = '' OR account ~ '^acct_[A-Za-z0-9]{1,250}$'),
    reconciled_until TIMESTAMPTZ,              -- NULL until a run completes
    run_id           BIGINT REFERENCES reconcile_runs (id),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, account)
);

-- Notifications whose money must be read from the provider's API, recorded
-- as received while the provider cannot be asked (no slot, over the shared
-- budget, unavailable, 429) and answered 2xx `accepted` (docs/design.md,
-- "The provider's pace"). The drain (app/receiver/drain.py) claims the
-- oldest due rows FOR UPDATE SKIP LOCKED, pushing not_before past the claim
-- (a host that dies mid-claim leaves them due again when it passes), reads
-- the provider's record, applies it through apply_event, then deletes the
-- row (a crash between the two: the next claim's apply_event says
-- duplicate). 'unknown': the provider has no record of the event;
-- a bounded row (no body) that no alert counts and no replay asks again, and
-- that a genuine delivery of the id later replaces.
CREATE TABLE IF NOT EXISTS waiting_notifications (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source         TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    event_id       TEXT NOT NULL CHECK (char_length(event_id) BETWEEN 1 AND 255),
    event_type     TEXT NOT NULL CHECK (char_length(event_type) BETWEEN 1 AND 64),
    state          TEXT NOT NULL DEFAULT 'waiting' CHECK (state IN ('waiting', 'unknown')),
    -- The exact bytes received while waiting; none once 'unknown'.
    body           BYTEA CHECK ((body IS NULL) = (state = 'unknown')),
    payload_sha256 BYTEA NOT NULL CHECK (octet_length(payload_sha256) = 32),
    attempts       INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error     TEXT CHECK (char_length(last_error) <= 1000),  -- why it waits, or why it is unknown
    received_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- When the drain may claim it next: now at receipt, a claim's expiry, or a backoff's end.
    not_before     TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT waiting_notifications_source_event_id_key UNIQUE (source, event_id)
);
CREATE INDEX IF NOT EXISTS waiting_notifications_due_idx
    ON waiting_notifications (not_before, id) WHERE state = 'waiting';

-- One row per `flask audit` run: the window of the provider's money records
-- it read ([since, until), by their creation at the provider), the grace
-- under which young items were pending rather than broken, and its verdict:
-- 'reconciled', 'reconciled_with_pending', 'breaks', or 'incomplete' (a
-- partial read: rate limited, the provider failing, a type the adapter does
-- not know), with the reason. statements: per currency, the ledger's and the
-- provider's sums and the lines that explain the difference. The audit
-- writes here and in audit_breaks only: never a money table.
CREATE TABLE IF NOT EXISTS audit_runs (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source        TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    account       TEXT NOT NULL DEFAULT '' CHECK (account = '' OR account ~ '^acct_[A-Za-z0-9]{1,250}$'),
    since         TIMESTAMPTZ NOT NULL,
    until         TIMESTAMPTZ NOT NULL,
    grace_seconds INTEGER NOT NULL CHECK (grace_seconds >= 0),
    verdict       TEXT NOT NULL DEFAULT 'running'
                  CHECK (verdict IN ('running', 'reconciled', 'reconciled_with_pending', 'breaks', 'incomplete')),
    reason        TEXT,
    listed        INTEGER NOT NULL DEFAULT 0 CHECK (listed >= 0),
    pending       INTEGER NOT NULL DEFAULT 0 CHECK (pending >= 0),
    breaks        INTEGER NOT NULL DEFAULT 0 CHECK (breaks >= 0),
    statements    JSONB,
    started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at   TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS audit_runs_source_idx ON audit_runs (source, account, verdict, finished_at);

-- One row per break an audit found, under a stable id (its class and keys):
-- 'new' in the run that first found it, 'persisting' while runs find it
-- again, 'resolved' once a run that read its window whole no longer does.
-- Both sides' keys and amounts (minor units), and the command that fixes it.
CREATE TABLE IF NOT EXISTS audit_breaks (
    source           TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    break_id         TEXT NOT NULL CHECK (break_id ~ '^brk_[0-9a-f]{20}$'),
    account          TEXT NOT NULL DEFAULT '',
    class            TEXT NOT NULL CHECK (class IN ('missing_in_ledger', 'missing_at_provider', 'amount_mismatch',
                                                    'currency_mismatch', 'state_mismatch', 'user_mismatch',
                                                    'matched_by_amount_only', 'unknown_provider_type')),
    priority         BOOLEAN NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('new', 'persisting', 'resolved')),
    provider_key     TEXT,
    ledger_key       TEXT,
    provider_amount  BIGINT,
    ledger_amount    BIGINT,
    provider_currency TEXT,
    ledger_currency  TEXT,
    provider_user    TEXT,
    ledger_user      TEXT,
    occurred_at      TIMESTAMPTZ NOT NULL,
    detail           TEXT NOT NULL,
    fix              TEXT NOT NULL,
    runs_seen        INTEGER NOT NULL DEFAULT 1 CHECK (runs_seen >= 1),
    first_run        BIGINT NOT NULL REFERENCES audit_runs (id),
    last_run         BIGINT NOT NULL REFERENCES audit_runs (id),
    first_seen_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    resolved_run     BIGINT REFERENCES audit_runs (id),
    resolved_at      TIMESTAMPTZ,
    PRIMARY KEY (source, break_id)
);
CREATE INDEX IF NOT EXISTS audit_breaks_open_idx ON audit_breaks (source, account, status);

-- A user row's opening balance is its balance at insert, unless given.
CREATE OR REPLACE FUNCTION user_balances_set_opening() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    NEW.opening_balance_cents := coalesce(NEW.opening_balance_cents, NEW.balance_cents);
    RETURN NEW;
END
$$;
CREATE OR REPLACE TRIGGER user_balances_set_opening
    BEFORE INSERT ON user_balances
    FOR EACH ROW EXECUTE FUNCTION user_balances_set_opening();

-- The change feed's wake-up: one notification per writing transaction, sent
-- at its commit, where the database's webhook_ledger.feed_notify is on
-- (NOTIFY serialises commits: docs/operations.md, "Following the journal").
CREATE OR REPLACE FUNCTION ledger_journal_notify() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ledger_journal', '');
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER ledger_journal_notify
    AFTER INSERT ON ledger_journal
    FOR EACH STATEMENT
    WHEN (current_setting('webhook_ledger.feed_notify', TRUE) = 'on')  -- off: the function is not even called
    EXECUTE FUNCTION ledger_journal_notify();
