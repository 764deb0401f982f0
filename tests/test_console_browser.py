"""The console answers an operator's questions from the page alone, in headless Chromium.

Each test is one question of the console's design: what is failing and why, which queue is
backing up and since when, which worker holds a stuck job, retry every failure of one task
since noon; and the list, the job view, the keyboard and a narrow screen. `worker api` runs as
a process of its own; jobs are real rows, run by a real worker where a test needs one.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from support import (
    Processes,
    insert_job,
    insert_stage,
    insert_worker,
    query,
    status_of,
    wait_for,
)
from support.browser import BROWSER, chromium_page, overflow, screenshot
from support.duties import roll_up
from test_api import start_api

from worker import Client

pytestmark = BROWSER


def test_what_is_failing_and_why(env, database_url, processes: Processes, tmp_path):
    from playwright.sync_api import expect

    api = start_api(env, processes)
    processes.worker(env, "testtasks")
    client = Client(database_url)
    failing = [client.enqueue("always_fails", {}, max_retries=0).job_id for _ in range(2)]
    client.enqueue("add", {"a": 1, "b": 2})
    wait_for(lambda: {status_of(database_url, j) for j in failing} == {"failed"}, timeout=60)

    with chromium_page() as page:
        page.goto(api.base + "/")
        page.click("#tab-failed")
        expect(page.locator("#tab-failed .n")).to_have_text("2", timeout=10_000)
        rows = page.locator("#jobs tbody tr.job")
        expect(rows).to_have_count(2)
        expect(rows.first.locator("td.c-error")).to_have_text(
            "RuntimeError: this task always fails"
        )
        rows.first.click()
        # The final status and its reason at once, from the job, not after its events.
        expect(page.locator("#progress")).to_have_attribute("data-state", "failed", timeout=2_000)
        expect(page.locator("#progress-label")).to_have_text(
            "failed — RuntimeError: this task always fails"
        )
        expect(page.locator("#d-status")).to_have_text("failed")
        expect(page.locator("#d-error")).to_contain_text("Traceback")
        screenshot(page, tmp_path, "console-failed")


def test_which_queue_is_backing_up_and_since_when(env, database_url, processes, tmp_path):
    from playwright.sync_api import expect

    api = start_api(env, processes)
    for _ in range(6):
        insert_job(
            database_url,
            "render",
            queue="reports",
            created_at="sql:now() - interval '20 minutes'",
            run_at="sql:now() - interval '20 minutes'",
        )
    insert_job(database_url, "send", queue="mail")
    # The rollup as the workers wrote it minute by minute: reports has waited 20 minutes.
    query(
        database_url,
        "INSERT INTO worker.job_rollups (minute, queue, task, pending, completed) "
        "SELECT date_trunc('minute', now()) - make_interval(mins => m), 'reports', 'render', "
        "6, 0 FROM generate_series(1, 20) AS m",
    )
    query(
        database_url,
        "INSERT INTO worker.job_rollups (minute, queue, task, completed) "
        "SELECT date_trunc('minute', now()) - make_interval(mins => m), 'mail', 'send', 3 "
        "FROM generate_series(1, 40) AS m",
    )
    roll_up(database_url)  # this minute's sample
    since = (datetime.now(UTC) - timedelta(minutes=20)).replace(second=0, microsecond=0)

    with chromium_page() as page:
        page.goto(api.base + "/#queues")
        reports = page.locator('#stats tbody tr[data-queue="reports"]')
        expect(reports).to_have_class("backlog", timeout=10_000)
        expect(reports.locator("td.waiting")).to_contain_text("20 min (since")
        expect(page.locator('#stats tbody tr[data-queue="mail"]')).not_to_have_class("backlog")
        legend = page.locator('#depth-legend span[data-queue="reports"]')
        expect(legend).to_have_text(f"reports: 6 due — waiting since {since:%H:%M}")
        expect(page.locator("#chart-outcomes")).to_have_attribute("data-completed", "120")
        expect(page.locator('#chart-depth polyline[data-queue="reports"]')).not_to_have_count(0)
        screenshot(page, tmp_path, "console-queues")
        # The row's controls change the queue, with the token.
        page.fill("#token", api.token or "")
        page.click('#stats tr[data-queue="reports"] button.toggle')
        controls = page.locator('#stats tr[data-queue="reports"] td.controls')
        expect(controls).to_have_text("paused", timeout=10_000)
        page.fill('#stats tr[data-queue="reports"] input[aria-label="reports concurrency"]', "3")
        page.click('#stats tr[data-queue="reports"] button.set')
        expect(controls).to_have_text("paused, 3 at once", timeout=10_000)
        page.click('#stats tr[data-queue="reports"] button.toggle')
        expect(controls).to_have_text("3 at once", timeout=10_000)
    assert query(
        database_url, "SELECT paused, concurrency FROM worker.queues WHERE name = 'reports'"
    ) == [(False, 3)]


def test_which_worker_holds_a_stuck_job(env, database_url, processes, tmp_path):
    from playwright.sync_api import expect

    # A lease long enough that the live worker's row, which nothing renews here, stays live.
    api = start_api(env, processes, extra={"WORKER_LEASE_SECONDS": "120"})
    dead = insert_worker(database_url, heartbeat_age="10 minutes", hostname="box-7", pid=4242)
    insert_worker(database_url, hostname="box-8", pid=77)
    stuck = insert_job(
        database_url,
        "export",
        status="processing",
        worker_id=dead,
        started_at="sql:now() - interval '2 hours'",
    )
    insert_stage(database_url, stuck, "extract", started_at="sql:now() - interval '2 hours'")
    insert_stage(database_url, stuck, "load", status="running")

    with chromium_page() as page:
        page.goto(api.base + "/")
        page.click("#tab-running")
        row = page.locator(f'#jobs tbody tr[data-job-id="{stuck}"]')
        expect(row.locator("td.c-worker")).to_have_text("box-7:4242", timeout=10_000)
        expect(row.locator("td").nth(8)).to_have_text("2.0 h")
        row.click()
        expect(page.locator("#d-fields")).to_contain_text("box-7:4242, heartbeat 10 min ago")
        # No worker knows the task's stages: the view lists those its rows show.
        expect(page.locator("#stage-count")).to_have_text("1 of 2 done (as the rows show)")
        expect(page.locator("#progress-label")).to_have_text("stage 2 of 2: load (so far)")
        expect(page.locator("#d-fields dd.stale")).to_contain_text("presumed dead")

        page.click("#view-workers")
        box7 = page.locator("#workers tbody tr", has_text="box-7")
        expect(box7).to_have_class("stale", timeout=10_000)
        expect(box7.locator("td.heartbeat")).to_contain_text("missed")
        expect(box7.locator(f'a[data-job-id="{stuck}"]')).to_contain_text("export")
        expect(page.locator("#workers tbody tr", has_text="box-8")).not_to_have_class("stale")
        screenshot(page, tmp_path, "console-workers")
        box7.locator("a").click()  # to the job, from the worker
        expect(page.locator("#d-id")).to_have_text(stuck)


def test_which_tasks_no_live_worker_can_run(env, database_url, processes, tmp_path):
    from playwright.sync_api import expect

    api = start_api(env, processes)
    worker = processes.worker(env, "testtasks")
    wait_for(
        lambda: query(database_url, "SELECT count(*) FROM worker.workers")[0][0] == 1,
        message="the worker to register",
    )
    # A typo in a plain-SQL enqueue, and a queue no worker runs.
    query(database_url, "INSERT INTO worker.jobs (task, payload) VALUES ('resze', '{}')")
    insert_job(database_url, "send", queue="mail")

    with chromium_page() as page:
        page.goto(api.base + "/")
        notice = page.locator("#unserved")
        expect(notice).to_be_visible(timeout=10_000)
        expect(notice.locator('li[data-task="resze"]')).to_contain_text(
            "1 pending, the oldest enqueued"
        )
        expect(notice.locator('li[data-task="resze"]')).to_contain_text(
            "the one live worker of queue default did not register it"
        )
        expect(notice.locator('li[data-task="send"]')).to_contain_text(
            "no live worker runs queue mail"
        )
        page.click("#view-workers")
        expect(notice).to_be_visible()  # on every view
        screenshot(page, tmp_path, "console-unserved")
    assert worker.poll() is None


def test_retry_every_failure_of_one_task_since_noon(env, database_url, processes, tmp_path):
    from playwright.sync_api import expect

    api = start_api(env, processes)
    today = [
        insert_job(
            database_url, "charge", status="failed", finished_at="sql:now()", error="Declined: x"
        )
        for _ in range(3)
    ]
    early = insert_job(
        database_url, "charge", status="failed", finished_at="sql:now() - interval '3 hours'"
    )
    refund = insert_job(database_url, "refund", status="failed", finished_at="sql:now()")
    noon = max(
        datetime.now(UTC) - timedelta(hours=1),
        datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0),
    )

    with chromium_page() as page:
        page.goto(api.base + "/")
        page.fill("#token", api.token or "")
        page.click("#tab-failed")
        page.fill("#f-task", "charge")
        page.fill("#f-since", f"{noon:%H:%M}")
        rows = page.locator("#jobs tbody tr.job")
        expect(rows).to_have_count(3, timeout=10_000)
        page.click("#bulk-retry")
        expect(page.locator("#confirm-text")).to_have_text(
            f"Retry 3 jobs (failed, task charge, since {noon:%H:%M})?"
        )
        screenshot(page, tmp_path, "console-bulk-retry")
        # Nothing moves before the confirmation.
        assert {status_of(database_url, j) for j in today} == {"failed"}
        page.click("#confirm-yes")
        expect(page.locator("#bulk-message")).to_have_text("3 retried", timeout=10_000)
        expect(rows).to_have_count(0)
    assert {status_of(database_url, j) for j in today} == {"pending"}
    assert status_of(database_url, early) == "failed"
    assert status_of(database_url, refund) == "failed"


def test_the_list_tells_jobs_apart_and_reads_a_scheduled_job_as_scheduled(
    env, database_url, processes, tmp_path
):
    from playwright.sync_api import expect

    api = start_api(env, processes)
    client = Client(database_url)
    client.enqueue_many([("nobody_runs_this", {"n": n}) for n in range(40)])
    later = client.enqueue("nobody_runs_this", {}, delay=3600, priority=5).job_id

    with chromium_page() as page:
        page.goto(api.base + "/")
        rows = page.locator("#jobs tbody tr.job")
        expect(rows).to_have_count(41, timeout=10_000)
        ids = rows.locator("td:first-child code").all_text_contents()
        assert len(set(ids)) == 41, ids  # not 41 copies of one timestamp prefix
        row = page.locator(f'#jobs tbody tr[data-job-id="{later}"]')
        expect(row.locator("td").first).to_have_attribute("title", later)
        expect(row.locator(".badge")).to_have_text("scheduled")
        expect(row.locator("td.c-due")).to_have_text("in 60 min")
        expect(row.locator("td.c-priority")).to_have_text("5")
        expect(row.locator("td.c-created")).to_contain_text("s ago")
        # One line per row, and the list takes the page's width until a job is opened.
        heights = {round(b["height"]) for b in (r.bounding_box() for r in rows.all()[:10]) if b}
        assert max(heights) < 30, heights
        table = page.locator("#jobs").bounding_box()
        assert table is not None and table["width"] > 1200, table
        page.click("#tab-scheduled")
        expect(rows).to_have_count(1)
        expect(page.locator("#tab-scheduled .n")).to_have_text("1")
        screenshot(page, tmp_path, "console-jobs")


def test_the_job_view_lists_every_stage_and_reads_stage_2_of_4(
    env, database_url, processes, tmp_path
):
    from playwright.sync_api import expect

    api = start_api(env, processes)
    processes.worker(env, "testtasks")
    client = Client(database_url)
    job = client.enqueue("watched_export", {"ticks": 300, "tick": 0.1}).job_id
    wait_for(
        lambda: query(
            database_url,
            "SELECT 1 FROM worker.job_stages WHERE job_id = %s AND stage = 'poll'",
            (job,),
        ),
        timeout=60,
        message="the poll stage to start",
    )

    with chromium_page() as page:
        page.goto(api.base + f"/#job={job}")
        stages = page.locator("#stages tbody tr")
        expect(stages).to_have_count(4, timeout=10_000)
        expect(page.locator("#stages tbody tr.todo")).to_have_count(2)  # verify, the cleanup
        expect(page.locator('#stages tr[data-stage="remove_status_file"]')).to_contain_text(
            "(cleanup)"
        )
        expect(page.locator('#stages tr[data-stage="spawn"] .badge')).to_have_text("completed")
        expect(page.locator("#progress-label")).to_contain_text("stage 2 of 4", timeout=10_000)
        value = int(page.get_attribute("#progress", "aria-valuenow") or 0)
        assert 25 <= value < 50, value  # not a full bar at stage 2
        took = page.locator('#stages tr[data-stage="spawn"] td').nth(4)
        expect(took).to_contain_text(" s")
        screenshot(page, tmp_path, "console-job")


def test_a_message_about_the_job_goes_once_the_job_moves_on(env, database_url, processes):
    from playwright.sync_api import expect

    long_lease = {"WORKER_LEASE_SECONDS": "120"}  # no rescue of the held job meanwhile
    api = start_api(env, processes, extra=long_lease)
    processes.worker(env, "testtasks", extra=long_lease)
    asked = Client(database_url).enqueue("ask", {"question": "ship it?"}).job_id
    # Held by a worker that is alive but has not reached its next stage boundary yet.
    holder = insert_worker(database_url, hostname="box-1")
    slow = insert_job(
        database_url, "export", status="processing", worker_id=holder, started_at="sql:now()"
    )
    wait_for(lambda: status_of(database_url, asked) == "paused", timeout=60)

    with chromium_page() as page:
        page.goto(api.base + f"/#job={slow}")
        page.fill("#token", api.token or "")
        expect(page.locator("#cancel")).to_be_enabled(timeout=10_000)
        page.click("#cancel")
        # True while the job runs on to its next stage boundary; gone once it is cancelled.
        message = page.locator("#message")
        expect(message).to_contain_text("stops at its next stage boundary", timeout=10_000)
        page.wait_for_timeout(2500)  # a refresh of the job or two: the message still holds
        expect(message).to_contain_text("stops at its next stage boundary")
        query(
            database_url,
            "UPDATE worker.jobs SET status = 'cancelled', finished_at = now() WHERE id = %s",
            (slow,),
        )
        expect(page.locator("#d-status")).to_have_text("cancelled", timeout=10_000)
        expect(message).to_have_text("")

        page.goto(api.base + f"/#job={asked}")
        expect(page.locator("#resume")).to_be_enabled(timeout=10_000)
        page.fill("#answer", '{"ok": true}')
        page.click("#resume")
        expect(page.locator("#d-status")).to_have_text("completed", timeout=30_000)
        expect(page.locator("#d-result")).to_contain_text('"ok": true')
        # What the message said of the job is gone, or is still true.
        expect(message).not_to_contain_text("pending")
        expect(message).not_to_contain_text("processing")


def test_the_keyboard_reaches_search_and_jobs(env, database_url, processes):
    from playwright.sync_api import expect

    api = start_api(env, processes)
    wanted = insert_job(database_url, "mail", payload='{"to": "ada@example.com"}')
    insert_job(database_url, "mail", payload='{"to": "bob@example.com"}')

    with chromium_page() as page:
        page.goto(api.base + "/")
        expect(page.locator("#jobs tbody tr.job")).to_have_count(2, timeout=10_000)
        page.keyboard.press("/")
        expect(page.locator("#search")).to_be_focused()
        page.keyboard.type("ada@")
        expect(page.locator("#jobs tbody tr.job")).to_have_count(1, timeout=10_000)
        page.keyboard.press("Tab")
        expect(page.locator("#f-task")).to_be_focused()
        page.locator(f'#jobs tr[data-job-id="{wanted}"]').focus()
        page.keyboard.press("Enter")
        expect(page.locator("#d-id")).to_have_text(wanted)
        page.keyboard.press("Escape")
        expect(page.locator("#detail")).to_be_hidden()


def test_nothing_overflows_a_420_pixel_screen(env, database_url, processes, tmp_path):
    from playwright.sync_api import expect

    api = start_api(env, processes)
    worker = insert_worker(database_url, hostname="a-rather-long-host-name.example", pid=12345)
    job = insert_job(
        database_url,
        "a_task_with_a_long_name_for_narrow_screens",
        status="processing",
        worker_id=worker,
        started_at="sql:now()",
        payload='{"blob": "' + "x" * 400 + '"}',
    )
    insert_job(database_url, "mail", status="failed", error="E" * 300, finished_at="sql:now()")

    with chromium_page(width=420, height=800) as page:
        page.goto(api.base + "/")
        expect(page.locator("#jobs tbody tr.job")).to_have_count(2, timeout=10_000)
        assert overflow(page) == 0
        expect(page.locator("#jobs thead th.c-queue")).to_be_hidden()
        for kept in ("job", "task", "state", "took"):
            expect(page.locator("#jobs thead th", has_text=kept).first).to_be_visible()
        page.goto(api.base + f"/#job={job}")
        expect(page.locator("#d-id")).to_have_text(job)
        expect(page.locator("#d-payload")).to_contain_text("xxxx")
        assert overflow(page) == 0
        screenshot(page, tmp_path, "console-narrow")
        for name in ("queues", "workers"):
            page.click(f"#view-{name}")
            expect(page.locator(f"#{name}-view")).to_be_visible()
            page.wait_for_timeout(500)
            assert overflow(page) == 0, name
