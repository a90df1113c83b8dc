"""Redis: the per-event lock and the done marker, and the client that tells its failures apart."""
