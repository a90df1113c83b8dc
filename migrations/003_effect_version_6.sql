-- Effect version 6: a paid Checkout Session (checkout.session.completed,
-- .async_payment_succeeded) credits its PaymentIntent. `flask init-db`
-- recomputes, after this, the stored effects of rows of another version.
ALTER TABLE webhook_events ALTER COLUMN effect_version SET DEFAULT 6;
