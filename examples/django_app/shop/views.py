"""`POST /orders`: the order, its job and the stock it takes, in one transaction."""

from __future__ import annotations

import json

from django.db import connection, transaction
from django.db.models import F
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

import worker
from examples.django_app.shop.models import Order, Stock


class OutOfStock(Exception):
    pass


@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    data = json.loads(request.body)
    try:
        with transaction.atomic():
            order = Order.objects.create(item=data["item"], quantity=data["quantity"])
            # Django's own psycopg connection: the job commits or rolls back with the block.
            job = worker.enqueue(
                "send_receipt", {"order": order.id}, connection=connection.connection
            )
            taken = Stock.objects.filter(item=order.item, units__gte=order.quantity).update(
                units=F("units") - order.quantity
            )
            if not taken:
                raise OutOfStock(order.item)
    except OutOfStock as exc:
        return JsonResponse({"error": f"not enough {exc} in stock"}, status=409)
    return JsonResponse({"order": order.id, "job": job.job_id}, status=201)
