-- A payment moved into a Stripe connected account (pi_Y to acct_X/pi_Y) is
-- a journal row of its own, kind 'payment_moved', 0 cents, naming the
-- payment's key now (payment_id) and the key it had (moved_from, new), and
-- who moved it (actor), appended by the transaction that moves it (`flask
-- payments move-to-account`, or this file for the payments migration 005
-- moved). The journal is append-only and its change feed gives each row
-- once: the rows written under the old key keep it, and a reader (money.sql's
-- ledger_journal_keyed, `flask ledger verify`, a consumer of the feed)
-- reads a row of the old key written before that row under the new key.
-- The CHECKs are replaced under their names, NOT VALID (validated by
-- `flask init-db` after its commit, as 007's): every row meets them. They
-- also allow migration 009's kind 'give_back' (a spend given back: amount >
-- 0, its reference), which 009 leaves to this file, the one that replaces
-- them last.
ALTER TABLE ledger_journal
    ADD COLUMN moved_from TEXT CONSTRAINT ledger_journal_moved_from_check
    CHECK (char_length(moved_from) BETWEEN 1 AND 511),
    DROP CONSTRAINT ledger_journal_kind_check,
    ADD CONSTRAINT ledger_journal_kind_check
    CHECK (
        kind IN ('credit', 'refund_reversed', 'dispute_reinstated', 'give_back') AND amount_cents > 0
        OR kind IN ('refund', 'dispute_withdrawn', 'spend') AND amount_cents < 0
        OR kind = 'adjustment' AND amount_cents <> 0
        OR kind = 'payment_moved' AND amount_cents = 0
    ) NOT VALID,
    DROP CONSTRAINT ledger_journal_names_check,
    ADD CONSTRAINT ledger_journal_names_check
    CHECK (
        CASE kind
            WHEN 'adjustment' THEN num_nonnulls(event_id, movement_id, reference, moved_from) = 0
                AND num_nonnulls(source, payment_id) IN (0, 2) AND num_nonnulls(reason, actor) = 2
            WHEN 'spend' THEN num_nonnulls(source, event_id, payment_id, movement_id, reason, actor, moved_from) = 0
                AND reference IS NOT NULL
            WHEN 'give_back' THEN num_nonnulls(source, event_id, payment_id, movement_id, reason, actor, moved_from) = 0
                AND reference IS NOT NULL
            WHEN 'payment_moved' THEN num_nonnulls(source, payment_id, moved_from, actor) = 4
                AND num_nonnulls(event_id, movement_id, reference, reason) = 0
            ELSE num_nonnulls(source, event_id, payment_id) = 3
                AND num_nonnulls(reference, reason, actor, moved_from) = 0
        END
    ) NOT VALID;
-- A key is moved once at most.
CREATE UNIQUE INDEX ledger_journal_moved_from_key ON ledger_journal (source, moved_from) WHERE moved_from IS NOT NULL;

-- The payments migration 005 keyed in their account, whose journal rows it
-- left under their bare key: a payment keyed acct_X/pi_Y, none keyed pi_Y,
-- and journal rows of pi_Y.
INSERT INTO ledger_journal (kind, source, payment_id, moved_from, user_id, amount_cents, actor)
SELECT
    'payment_moved',
    k.source,
    k.payment_id,
    k.bare,
    k.user_id,
    0,
    'migration 005_connect_accounts.sql'
FROM (
    SELECT
        p.source,
        p.payment_id,
        p.user_id,
        substr(p.payment_id, strpos(p.payment_id, '/') + 1) AS bare
    FROM payments AS p
    WHERE p.payment_id ~ '^acct_[A-Za-z0-9]+/'
) AS k
WHERE
    EXISTS (SELECT FROM ledger_journal AS j WHERE j.source = k.source AND j.payment_id = k.bare)
    AND NOT EXISTS (SELECT FROM payments AS b WHERE b.source = k.source AND b.payment_id = k.bare)
ORDER BY k.source, k.payment_id;
