"""least-privilege roles: worker_client (enqueue, read status) and worker_runner (run jobs)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 08:40:00.000000

Two NOLOGIN group roles; give one to each application's login role:

    CREATE ROLE web LOGIN PASSWORD '...' IN ROLE worker_client;    -- enqueues, reads status
    CREATE ROLE jobs LOGIN PASSWORD '...' IN ROLE worker_runner;   -- runs `worker run`

- `worker_client` may enqueue (INSERT, `worker.enqueue()`) and read jobs, stages, progress
  events, workers and the admin views. It may not change a job: no cancel, retry or resume.
- `worker_runner` may also claim, complete, rescue, release and prune jobs, record stages and
  progress events, and keep its row in `worker.workers`. Neither may create or alter tables:
  migrations run as the schema owner.

Roles belong to the whole server, not to one database. This migration creates them when they
are missing and the migrating user may create roles (CREATEROLE or superuser); otherwise it
grants to whichever exist and says so in a NOTICE. A DBA then runs, once per server and then
in each database as the schema owner (or a superuser):

    CREATE ROLE worker_client NOLOGIN;
    CREATE ROLE worker_runner NOLOGIN;
    SELECT worker.grant_roles();

Downgrading revokes the grants and drops `worker.grant_roles()`; the roles stay (other
databases may use them): `DROP ROLE worker_client, worker_runner` once no database does.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLES = ("worker_client", "worker_runner")

CREATE_ROLES = """
DO $$
DECLARE
    may_create boolean := (SELECT rolcreaterole OR rolsuper FROM pg_roles
                           WHERE rolname = current_user);
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['worker_client', 'worker_runner'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = name) THEN
            CONTINUE;
        ELSIF may_create THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', name);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another database's migration created it meanwhile
            END;
        ELSE
            RAISE NOTICE 'role % is missing and % may not create roles: ask a DBA to run '
                         '"CREATE ROLE % NOLOGIN" then "SELECT worker.grant_roles()"',
                         name, current_user, name;
        END IF;
    END LOOP;
END $$
"""

# Every grant in one place, so a DBA who creates the roles later can apply them with one call.
# Privileges go to each role directly (no membership between them), which needs no ADMIN
# option on a role the migrating user did not create.
GRANT_FUNCTION = """
CREATE FUNCTION worker.grant_roles() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    done text[] := '{}';
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'worker_client') THEN
        GRANT USAGE ON SCHEMA worker TO worker_client;
        GRANT SELECT, INSERT ON worker.jobs TO worker_client;
        GRANT SELECT ON worker.job_stages, worker.job_events, worker.workers,
                        worker.queue_stats, worker.stuck_jobs, worker.failed_recently,
                        worker.slowest_tasks
              TO worker_client;
        GRANT EXECUTE ON FUNCTION
              worker.enqueue(text, jsonb, text, integer, timestamptz, integer)
              TO worker_client;
        done := done || 'worker_client'::text;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'worker_runner') THEN
        GRANT USAGE ON SCHEMA worker TO worker_runner;
        GRANT SELECT, INSERT, UPDATE, DELETE ON worker.jobs, worker.workers TO worker_runner;
        GRANT SELECT, INSERT, UPDATE ON worker.job_stages TO worker_runner;
        GRANT SELECT, INSERT ON worker.job_events TO worker_runner;
        GRANT USAGE, SELECT ON SEQUENCE worker.job_events_id_seq TO worker_runner;
        GRANT SELECT ON worker.queue_stats, worker.stuck_jobs, worker.failed_recently,
                        worker.slowest_tasks
              TO worker_runner;
        GRANT EXECUTE ON FUNCTION
              worker.enqueue(text, jsonb, text, integer, timestamptz, integer)
              TO worker_runner;
        done := done || 'worker_runner'::text;
    END IF;
    RETURN CASE WHEN cardinality(done) = 0 THEN 'no role to grant to'
                ELSE 'granted to ' || array_to_string(done, ', ') END;
END $$
"""

REVOKE = """
DO $$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['worker_client', 'worker_runner'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = name) THEN
            EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA worker FROM %I', name);
            EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA worker FROM %I', name);
            EXECUTE format('REVOKE ALL ON FUNCTION worker.enqueue(text, jsonb, text, integer, '
                           'timestamptz, integer) FROM %I', name);
            EXECUTE format('REVOKE ALL ON SCHEMA worker FROM %I', name);
        END IF;
    END LOOP;
END $$
"""


def upgrade() -> None:
    op.execute(CREATE_ROLES)
    op.execute(GRANT_FUNCTION)
    op.execute("SELECT worker.grant_roles()")


def downgrade() -> None:
    op.execute(REVOKE)
    op.execute("DROP FUNCTION worker.grant_roles()")
