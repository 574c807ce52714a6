"""Infrastructure shared by the apps: SQL and database-vendor helpers, tasks sent by name; no domain code."""
