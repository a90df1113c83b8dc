-- The change feed (money.sql's journal_changes): each journal row's writing
-- transaction, an index to read by it, and the notification at commit.
-- Rows written before this migration are given xid 1 (committed before any
-- cursor's first snapshot); the UPDATE rewrites the journal once, under this
-- migration's lock.
ALTER TABLE ledger_journal ADD COLUMN xid XID8;
UPDATE ledger_journal SET xid = '1';
ALTER TABLE ledger_journal ALTER COLUMN xid SET DEFAULT pg_current_xact_id(),
    ALTER COLUMN xid SET NOT NULL;
CREATE INDEX ledger_journal_xid_idx ON ledger_journal (xid, id);

CREATE FUNCTION ledger_journal_notify() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ledger_journal', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER ledger_journal_notify
    AFTER INSERT ON ledger_journal
    FOR EACH STATEMENT
    WHEN (current_setting('webhook_ledger.feed_notify', TRUE) = 'on')  -- off: the function is not even called
    EXECUTE FUNCTION ledger_journal_notify();
