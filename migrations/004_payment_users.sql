-- An operator's answer to which user a payment credits when none of its
-- events names one (`flask payments assign-user`): schema.sql's comment.
CREATE TABLE IF NOT EXISTS payment_users (
    source      TEXT NOT NULL CHECK (source ~ '^[a-z0-9-]{1,64}$'),
    payment_id  TEXT NOT NULL CHECK (char_length(payment_id) BETWEEN 1 AND 128),
    user_id     UUID NOT NULL REFERENCES user_balances (user_id),
    assigned_by TEXT NOT NULL CHECK (char_length(assigned_by) BETWEEN 1 AND 128),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, payment_id)
);
