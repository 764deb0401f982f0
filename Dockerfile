# The durable-worker image: the `worker` program (daemon, migrations, API) on Python 3.12.
# Your own tasks go in an image built FROM this one:
#     FROM durable-worker:local
#     COPY myapp /app/myapp
# and `worker run myapp.tasks` finds them (the working directory /app is on the import path).
FROM python:3.12-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY worker ./worker
COPY migrations ./migrations
# Editable, so `worker migrate` finds the migrations beside the package.
RUN pip install -e . \
    && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin worker

USER worker
# Only used when DATABASE_URL is unset (compose always sets it).
ENV WORKER_DATA_DIR=/tmp/worker-data
ENTRYPOINT ["worker"]
CMD ["--help"]
