"""The Django app (`worker.contrib.django`) in a real Django project on PostgreSQL: the admin
lists jobs, stages and workers, retries and cancels through the client, `manage.py worker`
runs the program on Django's database, and `enqueue` joins Django's transaction.

Django's settings are global to a process: they are configured once, on a database of this
module's own, made like every test database (from the migrated template).
"""

from __future__ import annotations

import html
import re
import uuid
from collections.abc import Iterator
from urllib.parse import unquote, urlsplit

import psycopg
import pytest
from support import query
from support.factories import insert_job, insert_stage, insert_worker

django = pytest.importorskip("django")


def _django_database(url: str) -> dict[str, object]:
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


@pytest.fixture(scope="module")
def django_url(pg_server: str, template_db: str) -> Iterator[str]:
    from django.conf import settings

    name = f"dj_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = pg_server.rsplit("/", 1)[0] + f"/{name}"
    if settings.configured:
        pytest.skip("Django was configured by another test of this process")
    settings.configure(
        SECRET_KEY="tests-only",
        ALLOWED_HOSTS=["testserver"],
        USE_TZ=True,
        ROOT_URLCONF="django_admin_urls",
        DATABASES={"default": _django_database(url)},
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "worker.contrib.django",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    yield url
    from django.db import connections

    connections.close_all()
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def admin_client(django_url: str):  # type: ignore[no-untyped-def]
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.create_superuser("admin", "admin@example.com", "secret")
    http = Client()
    http.force_login(user)
    return http


def test_the_admin_lists_jobs_stages_and_workers(django_url: str, admin_client) -> None:
    job = insert_job(django_url, "resize", '{"image": "cat.png"}', status="failed", error="boom")
    insert_stage(django_url, job, "fetch_image")
    insert_stage(django_url, job, "resize_image", status="failed", error="no memory")
    insert_worker(django_url, hostname="worker-host-7")

    jobs = admin_client.get("/admin/durable_worker/job/")
    assert jobs.status_code == 200
    assert job in jobs.content.decode()
    page = admin_client.get(f"/admin/durable_worker/job/{job}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "fetch_image" in text and "resize_image" in text and "no memory" in text
    stages = admin_client.get("/admin/durable_worker/stage/", {"q": job})
    assert stages.status_code == 200
    assert "resize_image" in stages.content.decode()
    workers = admin_client.get("/admin/durable_worker/workerprocess/")
    assert workers.status_code == 200
    assert "worker-host-7" in workers.content.decode()
    # Read-only: no add page, and the change form saves nothing.
    assert admin_client.get("/admin/durable_worker/job/add/").status_code == 403
    assert 'name="_save"' not in text


def _act(admin_client, action: str, *ids: str) -> str:  # type: ignore[no-untyped-def]
    answer = admin_client.post(
        "/admin/durable_worker/job/",
        {"action": action, "_selected_action": list(ids)},
        follow=True,
    )
    assert answer.status_code == 200
    return html.unescape(answer.content.decode())  # the changelist, with the action's messages


def test_the_retry_action_runs_failed_jobs_again_and_refuses_others(
    django_url: str, admin_client
) -> None:
    failed = insert_job(django_url, status="failed", retry_count=3, error="boom")
    pending = insert_job(django_url)
    said = _act(admin_client, "retry_jobs", failed, pending)
    assert "1 job(s) retried" in said
    assert re.search(rf"{pending}.*pending", said)  # the client's refusal, as it words it
    rows = dict(query(django_url, "SELECT id::text, status FROM worker.jobs"))
    assert (rows[failed], rows[pending]) == ("pending", "pending")
    assert query(django_url, "SELECT retry_count FROM worker.jobs WHERE id = %s", (failed,)) == [
        (0,)
    ]


def test_the_cancel_action_cancels_a_waiting_job(django_url: str, admin_client) -> None:
    waiting = insert_job(django_url)
    assert "1 job(s) cancelled" in _act(admin_client, "cancel_jobs", waiting)
    assert query(django_url, "SELECT status FROM worker.jobs WHERE id = %s", (waiting,)) == [
        ("cancelled",)
    ]


def test_manage_py_worker_jobs_prints_the_jobs_of_django_s_database(
    django_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from django.core.management import call_command

    job = insert_job(django_url, "manage_py_listed")
    call_command("worker", "jobs", "--task", "manage_py_listed")
    out = capsys.readouterr().out
    assert "manage_py_listed" in out
    assert job[-12:] in out  # ids are shortened to their last characters

    # As `python manage.py worker ...` runs it: every argument is the program's own.
    from worker.contrib.django.management.commands.worker import Command

    Command().run_from_argv(["manage.py", "worker", "jobs", "--task", "manage_py_listed", "--json"])
    assert job in capsys.readouterr().out
    Command().run_from_argv(["manage.py", "worker", "--help"])  # the program's help, not Django's
    assert "background jobs on PostgreSQL" in capsys.readouterr().out


def test_manage_py_worker_refuses_a_bad_option_with_exit_code_2(
    django_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from django.core.management import call_command

    with pytest.raises(SystemExit) as exited:
        call_command("worker", "jobs", "--no-such-option")
    assert exited.value.code == 2
    assert "--no-such-option" in capsys.readouterr().err


def test_an_enqueue_in_a_rolled_back_block_leaves_no_job_and_a_committed_one_is_seen(
    django_url: str,
) -> None:
    from django.contrib.auth.models import Group
    from django.db import transaction

    from worker.contrib.django import enqueue

    class Refused(Exception):
        pass

    with pytest.raises(Refused), transaction.atomic():
        Group.objects.create(name="rolled back")
        gone = enqueue("send_receipt", {"order": 1})
        raise Refused
    with transaction.atomic():
        Group.objects.create(name="committed")
        kept = enqueue("send_receipt", {"order": 2})
        # Not yet committed: another connection does not see it.
        assert query(django_url, "SELECT 1 FROM worker.jobs WHERE id = %s", (kept.id,)) == []
    rows = query(
        django_url, "SELECT id::text, payload FROM worker.jobs WHERE task = 'send_receipt'"
    )
    assert rows == [(kept.id, {"order": 2})]
    assert gone.id != kept.id
    assert list(Group.objects.values_list("name", flat=True)) == ["committed"]


def test_the_actions_are_offered_only_to_users_who_may_change_jobs(django_url: str) -> None:
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    viewer = User.objects.create_user("viewer", password="x", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    http = Client()
    http.force_login(viewer)
    listed = http.get("/admin/durable_worker/job/").content.decode()
    assert "retry_jobs" not in listed and "cancel_jobs" not in listed

    operator = User.objects.create_user("operator", password="x", is_staff=True)
    operator.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_job", "change_job"])
    )
    http.force_login(operator)
    listed = http.get("/admin/durable_worker/job/").content.decode()
    assert "retry_jobs" in listed and "cancel_jobs" in listed
