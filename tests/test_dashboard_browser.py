"""The dashboard in a real headless Chromium, against `worker api` and `worker run` processes.

Needs Debian's `chromium` (/usr/bin/chromium), driven through Playwright's Python package; the
test is skipped only when that browser is absent.
"""

from __future__ import annotations

import time

from support import Processes, query, wait_for
from support.browser import BROWSER, CHROMIUM, CHROMIUM_ARGS
from test_api import start_api, status_of

from worker import Client

pytestmark = BROWSER


def test_dashboard_shows_live_progress_and_cancels_a_job_with_its_button(
    env, database_url, processes: Processes, tmp_path
):
    from playwright.sync_api import expect, sync_playwright

    api = start_api(env, processes)
    processes.worker(env, "testtasks", extra={"WORKER_CONCURRENCY": "4"})
    client = Client(database_url)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(api.base + "/")
            page.wait_for_selector("#tabs button")
            # Enqueued once the page is up, so that the job is watched from its start.
            watched = client.enqueue("watched_export", {"ticks": 30, "tick": 0.4}).job_id
            doomed = client.enqueue("watched_export", {"ticks": 600, "tick": 0.1}).job_id
            wait_for(lambda: status_of(database_url, watched) == "processing", message="running")
            # Open the running job from the list.
            page.locator(f'tr.job[data-job-id="{watched}"]').click(timeout=30_000)
            page.wait_for_selector("#detail:not([hidden])")
            assert page.text_content("#d-id") == watched
            bar = page.locator("#progress")
            seen: list[int] = []
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                seen.append(int(bar.get_attribute("aria-valuenow") or 0))
                if bar.get_attribute("data-state") == "done":
                    break
                time.sleep(0.1)
            assert bar.get_attribute("data-state") == "done", seen
            assert bar.get_attribute("aria-valuenow") == "100"
            # It advanced through the polling, not from 0 straight to done.
            partial = sorted({v for v in seen if 0 < v < 100})
            assert len(partial) >= 2, seen
            assert seen == sorted(seen), seen
            expect(page.locator("#stages tbody tr")).to_have_count(4, timeout=30_000)
            expect(page.locator("#d-status")).to_have_text("completed", timeout=30_000)
            expect(page.locator("#d-result")).to_contain_text('"verified": true')
            page.screenshot(path=str(tmp_path / "dashboard-done.png"), full_page=True)

            # Cancel the other job with the button, the token typed into the page.
            page.fill("#token", api.token or "")
            page.locator(f'tr.job[data-job-id="{doomed}"]').click(timeout=30_000)
            expect(page.locator("#d-id")).to_have_text(doomed)
            expect(bar).to_have_attribute("data-state", "running", timeout=30_000)
            page.click("#cancel")
            wait_for(lambda: status_of(database_url, doomed) == "cancelled", timeout=60)
            expect(bar).to_have_attribute("data-state", "cancelled", timeout=30_000)
            expect(page.locator("#d-status")).to_have_text("cancelled", timeout=30_000)
            expect(page.locator("#cancel")).to_be_disabled()
            expect(page.locator("#retry")).to_be_enabled()
            page.screenshot(path=str(tmp_path / "dashboard-cancelled.png"), full_page=True)

            # The token survives a reload (kept in localStorage), and a wrong one is refused.
            page.reload()
            assert page.input_value("#token") == api.token
            page.fill("#token", "wrong")
            page.locator(f'tr.job[data-job-id="{doomed}"]').click(timeout=30_000)
            expect(page.locator("#retry")).to_be_enabled(timeout=30_000)
            page.click("#retry")
            expect(page.locator("#message")).to_contain_text("403", timeout=30_000)
        finally:
            browser.close()
    assert status_of(database_url, doomed) == "cancelled"  # the wrong token changed nothing
    stages = dict(
        query(
            database_url,
            "SELECT stage, status FROM worker.job_stages WHERE job_id = %s",
            (doomed,),
        )
    )
    assert stages["poll"] == "cancelled" and stages["remove_status_file"] == "completed"


def test_rows_added_with_more_stay_through_the_list_refresh(env, database_url, processes):
    from playwright.sync_api import expect, sync_playwright

    api = start_api(env, processes)
    Client(database_url).enqueue_many([("nobody_runs_this", {"n": n}) for n in range(70)])

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(api.base + "/")
            rows = page.locator("#jobs tbody tr.job")
            expect(rows).to_have_count(50, timeout=30_000)
            page.click("#more")
            expect(rows).to_have_count(70, timeout=30_000)
            expect(page.locator("#more")).to_be_hidden()
            # The list refreshes every 2 s; the rows of the second page stay through it.
            page.wait_for_timeout(4500)
            expect(rows).to_have_count(70)
        finally:
            browser.close()


def test_the_queues_table_shows_each_queue_s_pause_and_limits(env, database_url, processes):
    from playwright.sync_api import expect, sync_playwright

    api = start_api(env, processes)
    client = Client(database_url)
    client.enqueue("nobody_runs_this", {}, queue="mail")
    client.enqueue("nobody_runs_this", {}, queue="free")
    client.pause_queue("mail")
    client.limit_queue("mail", concurrency=2, rate=5)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(api.base + "/#queues")
            mail = page.locator('#stats tbody tr[data-queue="mail"] td.controls')
            expect(mail).to_have_text("paused, 2 at once, 5/s", timeout=30_000)
            free = page.locator('#stats tbody tr[data-queue="free"] td.controls')
            expect(free).to_have_text("")
            client.resume_queue("mail")  # the table follows within its refresh
            expect(mail).to_have_text("2 at once, 5/s", timeout=10_000)
        finally:
            browser.close()
