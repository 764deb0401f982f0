"""The Django example (examples/django_app/): a view enqueues inside `transaction.atomic()` on
Django's own psycopg connection, so its job exists only if the block commits.

Django's settings are global to a process, so the example runs in a subprocess of its own
(Django's test client, the suite's real PostgreSQL); the job then runs in this process
(`drain`), with the example's task.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from support import ROOT, query

import examples.django_app.tasks  # noqa: F401  (registers send_receipt)
from worker.testing import drain

# Creates the tables, stocks ten widgets, then places an order the stock covers and one it
# does not; prints each answer's status and body.
PLACE_TWO_ORDERS = textwrap.dedent(
    """
    import json

    import django
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    django.setup()
    call_command("migrate", run_syncdb=True, verbosity=0)
    from examples.django_app.shop.models import Stock

    Stock.objects.create(item="widget", units=10)
    http = Client()
    answers = []
    for quantity in (2, 11):
        body = json.dumps({"item": "widget", "quantity": quantity})
        answer = http.post("/orders", data=body, content_type="application/json")
        answers.append([answer.status_code, answer.json()])
    print(json.dumps({"answers": answers, "driver": type(connection.connection).__module__}))
    """
)


def test_view_enqueues_in_its_atomic_block_and_a_rolled_back_order_leaves_no_job(database_url):
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_SETTINGS_MODULE": "examples.django_app.settings",
        "PYTHONPATH": str(ROOT),
    }
    ran = subprocess.run(
        [sys.executable, "-c", PLACE_TWO_ORDERS],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["driver"].startswith("psycopg")  # Django's own connection is psycopg 3's
    (placed, placed_body), (refused, refused_body) = out["answers"]
    assert (placed, refused) == (201, 409)
    assert refused_body == {"error": "not enough widget in stock"}

    # Only the committed order and its job exist; the refused one's rolled back with it.
    order = placed_body["order"]
    assert query(database_url, "SELECT id FROM shop_order") == [(order,)]
    assert query(database_url, "SELECT units FROM shop_stock") == [(8,)]
    stored = query(database_url, "SELECT id::text, task, payload FROM worker.jobs")
    assert stored == [(placed_body["job"], "send_receipt", {"order": order})]

    (done,) = drain(url=database_url)
    assert (done.status, done.result) == ("completed", f"receipt for order {order}")
