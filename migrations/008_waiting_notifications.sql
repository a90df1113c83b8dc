-- The provider's pace (docs/design.md, "The provider's pace"): a notification
-- whose money must be read from its provider's API, when the provider cannot
-- be asked now (no slot, over the shared budget, unavailable, 429), is
-- recorded here as received and answered 2xx `accepted`; the drain applies it
-- through apply_event once the provider's record is read, then deletes it. A notification the provider has no record of keeps a
-- bounded row here ('unknown': no body), not a failed event.
CREATE TABLE IF NOT EXISTS waiting_notifications (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source         TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    event_id       TEXT NOT NULL CHECK (char_length(event_id) BETWEEN 1 AND 255),
    event_type     TEXT NOT NULL CHECK (char_length(event_type) BETWEEN 1 AND 64),
    state          TEXT NOT NULL DEFAULT 'waiting' CHECK (state IN ('waiting', 'unknown')),
    body           BYTEA CHECK ((body IS NULL) = (state = 'unknown')),
    payload_sha256 BYTEA NOT NULL CHECK (octet_length(payload_sha256) = 32),
    attempts       INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error     TEXT CHECK (char_length(last_error) <= 1000),
    received_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    not_before     TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT waiting_notifications_source_event_id_key UNIQUE (source, event_id)
);
CREATE INDEX IF NOT EXISTS waiting_notifications_due_idx
    ON waiting_notifications (not_before, id) WHERE state = 'waiting';
