"""PostgreSQL: the pool, the schema, and the only code that writes the money tables (through money.sql's functions)."""
