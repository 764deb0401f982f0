"""The HTTP edge: REST verbs on jobs, live progress as Server-Sent Events, and a dashboard.

worker api --host 127.0.0.1 --port 8000          # or: create_app(url, token) in any ASGI server

Mounted inside another app (FastAPI, Starlette), give that app `lifespan=lifespan(jobs_app)`:
a mounted app's own lifespan does not run by itself.
"""

from worker.api.access import check_bind, is_loopback
from worker.api.app import create_app
from worker.api.lifespans import lifespan
from worker.api.server import serve

__all__ = ["check_bind", "create_app", "is_loopback", "lifespan", "serve"]
