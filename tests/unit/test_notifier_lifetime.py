"""The notifier's thread: it survives any error, and goes as soon as it is told no one listens."""

from __future__ import annotations

import threading

from worker.db.notifier import Notifier

UNREACHABLE = "postgresql://127.0.0.1:1/none?connect_timeout=1"


def test_an_unused_notifier_retires_at_once_when_told() -> None:
    listener = Notifier(UNREACHABLE, "test-listener")
    listener.subscribe("worker_jobs", lambda payload: None).close()
    thread = listener._thread
    assert thread is not None
    listener.retire_if_unused()
    thread.join(6)  # one reconnect backoff at most, never the 30 s linger
    assert not thread.is_alive()


def test_a_notifier_whose_thread_died_starts_another() -> None:
    listener = Notifier(UNREACHABLE, "test-listener")
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    listener._thread = dead
    sub = listener.subscribe("worker_jobs", lambda payload: None)
    assert listener._thread is not dead and listener._thread.is_alive()
    sub.close()
    listener.retire_if_unused()
