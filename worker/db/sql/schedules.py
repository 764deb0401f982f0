"""Periodic tasks: a tick fired once however many workers fire it, and the schedules' rows."""

# Safe for any number of workers firing the same tick: the upsert is a compare-and-set on the
# schedule's row (it advances `last_tick` only to a later tick, and the row's lock makes a
# second worker re-check against the first one's tick), and the job is inserted only from the
# row it advanced, in the same statement, so a tick's job commits with its advance or not at
# all. A row seen for the first time is inserted without a job: a new schedule fires from its
# next tick. (`xmax = 0` tells an inserted row from an updated one: an update through ON
# CONFLICT leaves the row locked by this transaction.) One job however many ticks were missed:
# the workers fire only the latest. The job goes to the schedule's queue, a parameter.
FIRE_TICK = """
WITH advanced AS (
    INSERT INTO worker.schedules AS s (key, task, spec, last_tick)
    VALUES (%(key)s, %(task)s, %(spec)s, %(tick)s)
    ON CONFLICT (key) DO UPDATE
        SET last_tick = excluded.last_tick, fired = s.fired + 1, fired_at = now()
        WHERE s.last_tick < excluded.last_tick
    RETURNING s.xmax <> '0'::xid AS fired
)
INSERT INTO worker.jobs (task, payload, queue, run_at)
SELECT %(task)s, '{}', %(queue)s, %(tick)s FROM advanced WHERE fired
RETURNING id::text
"""

# Read-only: what `worker schedule` shows beside each schedule of the task modules.
SCHEDULE_ROWS = """
SELECT key, last_tick, fired, fired_at FROM worker.schedules WHERE key = ANY(%(keys)s)
"""
