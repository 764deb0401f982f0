"""The HTTP edge: REST verbs on jobs, live progress as Server-Sent Events, and a dashboard.

worker api --host 127.0.0.1 --port 8000          # or: create_app(url, token) in any ASGI server
"""

from worker.api.access import check_bind, is_loopback
from worker.api.app import create_app
from worker.api.server import serve

__all__ = ["check_bind", "create_app", "is_loopback", "serve"]
