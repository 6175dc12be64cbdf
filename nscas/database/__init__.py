"""The database engines: SQLite and PostgreSQL, the tables, migrations' versions."""
