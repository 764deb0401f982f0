"""Integrations with other tools, each an optional extra: `worker.contrib.sentry` (extra
`sentry`), `worker.contrib.django` (extra `django`)."""
