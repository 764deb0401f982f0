"""The task the Django example enqueues: `worker run examples.django_app.tasks`."""

from __future__ import annotations

from typing import Any

from worker import task


@task(name="send_receipt")
def send_receipt(payload: dict[str, Any]) -> str:
    """Stands for the mail to the customer."""
    return f"receipt for order {payload['order']}"
