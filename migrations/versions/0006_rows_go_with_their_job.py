"""stages and events go with their job by trigger, not by foreign key

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 22:00:00.000000

Every stage row and progress event checked its job through a foreign key: a lookup and a
key-share lock on the job's row for each row written, about 15 us of server CPU apiece (a
3-stage job writes three stage rows and seven events), and a second locker on a row its worker
updates at every step. The check guarded nothing the writers do not guard already: only the
job's holder writes its stages, with the job's row locked (`sql.STAGE_WRITES`), and events are
stored only for jobs that exist (`sql.PUBLISH_EVENTS`).

What the foreign keys did on delete, the trigger `jobs_deleted` does in the same statement:
deleting jobs (retention, `worker prune`, plain SQL) deletes their stages and events, and
TRUNCATE of worker.jobs empties both tables (quickest when the TRUNCATE names them too). The
triggers run as the schema owner, so a role that may delete jobs (worker_runner) needs no
rights on the other two tables.

The events' primary key becomes (job_id, id), which every read uses, in place of (id) plus a
second index on (job_id, id): one index entry per event instead of two. Ids stay unique: they
come from the table's sequence. Building it locks worker.job_events while it reads the whole
table: workers publishing meanwhile buffer their events and write them once it is done.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# `= ANY(ARRAY(...))`: an index scan per table whatever the planner guesses of the transition
# table, which has no statistics.
DELETED_FUNCTION = """
CREATE FUNCTION worker.jobs_deleted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM worker.job_stages WHERE job_id = ANY(ARRAY(SELECT id FROM gone));
    DELETE FROM worker.job_events WHERE job_id = ANY(ARRAY(SELECT id FROM gone));
    RETURN NULL;
END $$
"""

# DELETE, not TRUNCATE: a TRUNCATE naming these tables too (`TRUNCATE worker.jobs,
# worker.job_stages, ...`) has them open, and they are empty by now.
TRUNCATED_FUNCTION = """
CREATE FUNCTION worker.jobs_truncated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM worker.job_stages;
    DELETE FROM worker.job_events;
    RETURN NULL;
END $$
"""

UPGRADE = [
    "ALTER TABLE worker.job_stages DROP CONSTRAINT job_stages_job_id_fkey",
    "ALTER TABLE worker.job_events DROP CONSTRAINT job_events_job_id_fkey",
    "ALTER TABLE worker.job_events DROP CONSTRAINT job_events_pkey",
    "DROP INDEX worker.job_events_job_idx",
    "ALTER TABLE worker.job_events ADD CONSTRAINT job_events_pkey PRIMARY KEY (job_id, id)",
    DELETED_FUNCTION,
    "CREATE TRIGGER jobs_deleted AFTER DELETE ON worker.jobs REFERENCING OLD TABLE AS gone "
    "FOR EACH STATEMENT EXECUTE FUNCTION worker.jobs_deleted()",
    TRUNCATED_FUNCTION,
    "CREATE TRIGGER jobs_truncated AFTER TRUNCATE ON worker.jobs "
    "FOR EACH STATEMENT EXECUTE FUNCTION worker.jobs_truncated()",
]

# Rows whose job is gone (an event stored while its job was being deleted) would stop the
# foreign keys from coming back.
DOWNGRADE = [
    "DROP TRIGGER jobs_truncated ON worker.jobs",
    "DROP FUNCTION worker.jobs_truncated()",
    "DROP TRIGGER jobs_deleted ON worker.jobs",
    "DROP FUNCTION worker.jobs_deleted()",
    "DELETE FROM worker.job_stages AS s "
    "WHERE NOT EXISTS (SELECT FROM worker.jobs AS j WHERE j.id = s.job_id)",
    "DELETE FROM worker.job_events AS e "
    "WHERE NOT EXISTS (SELECT FROM worker.jobs AS j WHERE j.id = e.job_id)",
    "ALTER TABLE worker.job_events DROP CONSTRAINT job_events_pkey",
    "ALTER TABLE worker.job_events ADD CONSTRAINT job_events_pkey PRIMARY KEY (id)",
    "CREATE INDEX job_events_job_idx ON worker.job_events (job_id, id)",
    "ALTER TABLE worker.job_events ADD CONSTRAINT job_events_job_id_fkey "
    "FOREIGN KEY (job_id) REFERENCES worker.jobs (id) ON DELETE CASCADE",
    "ALTER TABLE worker.job_stages ADD CONSTRAINT job_stages_job_id_fkey "
    "FOREIGN KEY (job_id) REFERENCES worker.jobs (id) ON DELETE CASCADE",
]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
