"""Django: the jobs, their stages and the workers in Django's admin, `manage.py worker ...`,
and `enqueue` on Django's own connection, so a job commits or rolls back with the
`transaction.atomic()` block it was enqueued in.

Install the extra (`pip install 'durable-worker[django]'`) and add the app:

    INSTALLED_APPS = [..., "django.contrib.admin", "worker.contrib.django"]

The admin's models (`worker.contrib.django.models`) are read-only views of the `worker`
schema's tables (`managed = False`: Django never migrates them; `worker migrate` does); its
retry and cancel actions call the client (`Client.retry`, `Client.cancel`), as `worker retry`
and `worker cancel` do. `manage.py worker ARGS` runs the `worker` program with ARGS on the
database of Django's settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

if TYPE_CHECKING:
    from worker.client import Client, Job
    from worker.models import JSON

__all__ = ["client", "database_url", "enqueue"]

_clients: dict[str, Client] = {}


def database_url(using: str = "default") -> str:
    """The libpq URL of one of Django's databases (`DATABASES[using]`).

    Raises `ValueError` naming the alias if it is not a PostgreSQL database.
    """
    from django.conf import settings

    db: dict[str, Any] = settings.DATABASES[using]
    if "postgresql" not in db.get("ENGINE", ""):
        raise ValueError(
            f"DATABASES[{using!r}] is not PostgreSQL (ENGINE {db.get('ENGINE')!r}); "
            "durable-worker needs PostgreSQL"
        )
    user, password = quote(db.get("USER") or "", safe=""), quote(db.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host, port = str(db.get("HOST") or ""), str(db.get("PORT") or "")
    # libpq's own connection options (sslmode, ...) ride along; a socket folder is `host=`.
    params = {k: str(v) for k, v in (db.get("OPTIONS") or {}).items() if isinstance(v, str | int)}
    if host.startswith("/"):
        params["host"], host = host, ""
    netloc = f"{auth}{quote(host, safe='[]:')}{':' + port if port else ''}"
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql://{netloc}/{quote(db.get('NAME') or '', safe='')}{query}"


def client(using: str = "default") -> Client:
    """A `Client` of one of Django's databases, made once per alias."""
    from worker.client import Client

    if using not in _clients:
        _clients[using] = Client(database_url(using))
    return _clients[using]


def enqueue(
    task: str, payload: dict[str, JSON] | None = None, *, using: str = "default", **options: Any
) -> Job:
    """Enqueue a job on Django's own connection `using`: inside `transaction.atomic()` it
    commits or rolls back with the block; outside one it commits at once. `options` are
    `Client.enqueue`'s (`queue=`, `delay=`, `unique_key=`, ...).

    >>> with transaction.atomic():                                       # doctest: +SKIP
    ...     order = Order.objects.create(item="widget")
    ...     enqueue("send_receipt", {"order": order.id})
    """
    from django.db import connections

    wrapper = connections[using]
    wrapper.ensure_connection()
    return client(using).enqueue(task, payload, connection=wrapper.connection, **options)
