"""Side-by-side benchmark of durable-worker and other PostgreSQL job queues (`python -m bench`)."""
