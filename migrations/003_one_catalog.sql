-- 003: one catalog. A database that an earlier release's schema.sql upgraded
-- in place has the same columns as one created by schema.sql, but not quite
-- the same constraints: its (source, event_id) keys are unique indexes, not
-- UNIQUE constraints, and the journal's checks still bear ledger_credits'
-- names. This gives it the names and constraints of schema.sql, so that a
-- later migration may count on them. Each step changes only the catalog
-- (the index already exists: nothing is rebuilt or scanned), and does
-- nothing on a database that has them already.
DO $$
DECLARE
    v_table text;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['webhook_events', 'ledger_journal'] LOOP
        IF NOT EXISTS (SELECT FROM pg_constraint WHERE conrelid = v_table::regclass
                       AND conname = v_table || '_source_event_id_key') THEN
            EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I UNIQUE USING INDEX %I',
                           v_table, v_table || '_source_event_id_key', v_table || '_source_event_id_key');
        END IF;
    END LOOP;
    IF EXISTS (SELECT FROM pg_constraint WHERE conrelid = 'ledger_journal'::regclass
               AND conname = 'ledger_credits_event_id_check') THEN
        ALTER TABLE ledger_journal RENAME CONSTRAINT ledger_credits_event_id_check TO ledger_journal_event_id_check;
    END IF;
    IF EXISTS (SELECT FROM pg_constraint WHERE conrelid = 'ledger_journal'::regclass
               AND conname = 'ledger_credits_source_check') THEN
        ALTER TABLE ledger_journal RENAME CONSTRAINT ledger_credits_source_check TO ledger_journal_source_check;
    END IF;
END
$$;
