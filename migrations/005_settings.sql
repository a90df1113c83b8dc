-- 005: effects that do not depend on the settings. A row records the
-- settings its outcome was decided under (`flask ledger verify` judges it by
-- them); rows stored before keep NULL (unknown). Effect version 4 hashes an
-- effect from the bytes alone: init-db recomputes the stored ones, so that an
-- event refused by a setting is applied by its retry once the setting allows.
ALTER TABLE webhook_events ADD COLUMN ledger_currency TEXT;
ALTER TABLE webhook_events ADD COLUMN test_events_accepted BOOLEAN;
ALTER TABLE webhook_events ALTER COLUMN effect_version SET DEFAULT 4;
