-- Ids as long as Stripe documents them ("Stripe-generated object IDs, which
-- can contain up to 255 characters": https://docs.stripe.com/upgrades): an
-- event's id 1 to 255 characters (was 128); a payment's, a movement's or a
-- customer's key 1 to 511 (was 128), room for a connected account's
-- acct_X/pi_Y, two ids and the "/"; a reconciled account acct_ and 1 to 250
-- more (was 123). Each CHECK is replaced under its name.
--
-- Every row met the old bound, so it meets the new one. On the tables that
-- grow with the ledger the new CHECK is added NOT VALID: no scan while this
-- transaction holds the table's ACCESS EXCLUSIVE lock (every delivery waits
-- for it until init-db's transaction commits: a catalog change, but behind
-- any transaction already using the table); `flask init-db` validates it
-- after the commit (app/store/schema.py), one scan of each table under a
-- SHARE UPDATE EXCLUSIVE lock, which blocks neither reads nor writes, and
-- until then every new row is checked all the same. The small tables'
-- (links, assignments, reconcile's runs and watermarks) are checked here.
--
-- Effect version 8: an event refused before for an id of 129 to 255
-- characters was stored failed with a refusal's effect, which a retry that
-- now applies would contradict (409 payload_mismatch). `flask init-db`
-- recomputes, after this, the stored effects of rows of another version
-- (every stored event read once, in batches of their own transactions), so
-- that the provider's retry or `flask events replay` applies it.
ALTER TABLE webhook_events
    ALTER COLUMN effect_version SET DEFAULT 8,
    DROP CONSTRAINT webhook_events_event_id_check,
    ADD CONSTRAINT webhook_events_event_id_check CHECK (char_length(event_id) BETWEEN 1 AND 255) NOT VALID;
ALTER TABLE payments
    DROP CONSTRAINT payments_payment_id_check,
    ADD CONSTRAINT payments_payment_id_check CHECK (char_length(payment_id) BETWEEN 1 AND 511) NOT VALID;
ALTER TABLE movements
    DROP CONSTRAINT movements_movement_id_check,
    ADD CONSTRAINT movements_movement_id_check CHECK (char_length(movement_id) BETWEEN 1 AND 511) NOT VALID;
ALTER TABLE ledger_journal
    DROP CONSTRAINT ledger_journal_event_id_check,
    ADD CONSTRAINT ledger_journal_event_id_check CHECK (char_length(event_id) BETWEEN 1 AND 255) NOT VALID,
    DROP CONSTRAINT ledger_journal_payment_id_check,
    ADD CONSTRAINT ledger_journal_payment_id_check CHECK (char_length(payment_id) BETWEEN 1 AND 511) NOT VALID;
ALTER TABLE customer_links
    DROP CONSTRAINT customer_links_customer_id_check,
    ADD CONSTRAINT customer_links_customer_id_check CHECK (char_length(customer_id) BETWEEN 1 AND 511);
ALTER TABLE payment_users
    DROP CONSTRAINT payment_users_payment_id_check,
    ADD CONSTRAINT payment_users_payment_id_check CHECK (char_length(payment_id) BETWEEN 1 AND 511);
ALTER TABLE reconcile_runs
    DROP CONSTRAINT reconcile_runs_account_check,
    ADD CONSTRAINT reconcile_runs_account_check CHECK (account = '' OR account ~ '^acct_[A-Za-z0-9]{1,250}$');
ALTER TABLE reconcile_watermarks
    DROP CONSTRAINT reconcile_watermarks_account_check,
    ADD CONSTRAINT reconcile_watermarks_account_check
        CHECK (account = '' OR account ~ '^acct_[A-Za-z0-9]{1,250}$');
