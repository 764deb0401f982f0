"""The task the FastAPI example enqueues: `worker run examples.fastapi_app.tasks`."""

from __future__ import annotations

from typing import Any

from worker import task


@task(name="ship_order")
def ship_order(payload: dict[str, Any]) -> dict[str, Any]:
    """Stands for the call to the carrier: the order's shipment label."""
    return {"order": payload["order"], "label": f"SHIP-{payload['order']:06d}"}
