"""A FastAPI app that enqueues in the request's transaction, with `worker.api` mounted inside.

Run it, and a worker for its task (from the repository root, `DATABASE_URL` set or not):

    uvicorn --factory examples.fastapi_app.app:create_app
    worker run examples.fastapi_app.tasks

    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"id": 1, "item": "widget", "quantity": 2}'
    curl localhost:8000/worker/jobs/<job_id>        # the mounted job API

- `POST /orders` inserts the order, enqueues `ship_order` on the request's SQLAlchemy session
  (`connection=session`) and takes the stock; only then does it commit. An order the stock
  cannot cover is refused (409) after the enqueue: the transaction rolls back, and with it the
  order and the job. No worker ever sees a job whose order does not exist.
- `ship_order` is a two-stage pipeline (`tasks.py`); with the app instrumented for
  OpenTelemetry, the request, the job's attempt and each stage are one trace.
- `worker.api.create_app` is mounted at `/worker`, and `worker.api.lifespan` runs its lifespan
  (its event bus, its connections) inside the FastAPI app's: Starlette never runs a mounted
  app's lifespan by itself.

`tests/test_fastapi_example.py` runs both, against a real PostgreSQL.
"""
