"""The wake token: which idle worker answers a new job's notification."""

# Idle workers that claim alike (the same queues and tasks: one key) share one token, this
# session lock on a claim session: only its holder claims when a `worker_jobs` notification
# comes, so a new job costs one claim, not one per idle worker. Safe to lose: a holder that
# dies loses it with its session, and the others take it at their next poll. The first key is
# the lock's namespace.
TAKE_WAKE_TOKEN = "SELECT pg_try_advisory_lock(2002873189, %(key)s)"

# A holder with no free slot gives the token back and tells the others, so that the next idle
# one takes it now rather than at its next poll.
GIVE_BACK_WAKE_TOKEN = """
SELECT pg_advisory_unlock(2002873189, %(key)s), pg_notify('worker_wake', %(key)s::text)
"""
