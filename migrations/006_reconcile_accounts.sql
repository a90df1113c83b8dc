-- Reconcile per Stripe Connect account (`flask reconcile SOURCE --account acct_...`): each run and
-- watermark names the account whose events were listed, '' the platform's own (the key's) account,
-- as every row before this migration was. A watermark is one per source and account.
ALTER TABLE reconcile_runs ADD COLUMN account TEXT NOT NULL DEFAULT ''
    CHECK (account = '' OR account ~ '^acct_[A-Za-z0-9]{1,123}$');
ALTER TABLE reconcile_watermarks ADD COLUMN account TEXT NOT NULL DEFAULT ''
    CHECK (account = '' OR account ~ '^acct_[A-Za-z0-9]{1,123}$');
ALTER TABLE reconcile_watermarks DROP CONSTRAINT reconcile_watermarks_pkey, ADD PRIMARY KEY (source, account);
DROP INDEX reconcile_runs_source_idx;
CREATE INDEX reconcile_runs_source_idx ON reconcile_runs (source, account, status, finished_at);
