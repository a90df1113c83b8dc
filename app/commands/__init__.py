"""The operator's `flask` commands: init-db, events, ledger, users, redis and reconcile."""
