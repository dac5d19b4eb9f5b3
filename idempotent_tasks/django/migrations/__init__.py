"""The app's migrations: the SQL store's schema (see ``idempotent_tasks.django._schema``)."""
