"""The database adapter: connection URLs, the embedded server and every statement that matters."""
