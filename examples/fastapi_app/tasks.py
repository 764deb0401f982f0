"""The job the FastAPI example enqueues, a two-stage pipeline:
`worker run examples.fastapi_app.tasks`."""

from __future__ import annotations

from typing import Any

from worker import Context, Pipeline

ship_order = Pipeline("ship_order")


@ship_order.stage
def book_carrier(ctx: Context) -> dict[str, Any]:
    """Stands for the call to the carrier."""
    return {"order": ctx.payload["order"], "carrier": "ACME Freight"}


@ship_order.stage
def print_label(ctx: Context) -> dict[str, Any]:
    """The shipment's label, from what the carrier booked (the job's result)."""
    booked = ctx.outputs["book_carrier"]
    return {"order": booked["order"], "label": f"SHIP-{booked['order']:06d}"}
