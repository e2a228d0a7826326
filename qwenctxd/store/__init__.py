"""Storage helpers shared below all subsystems (SQLite cache databases)."""
