"""A Django project whose view enqueues inside `transaction.atomic()`, on Django's connection.

Django 4.2 and later talk to PostgreSQL through psycopg 3, so `connection.connection` (the
connection under Django's wrapper) is a psycopg `Connection`, which `connection=` takes: the
job joins the view's transaction, and exists only if the block commits.

Run it (from the repository root, `DATABASE_URL` set or not), with a worker for its task:

    DJANGO_SETTINGS_MODULE=examples.django_app.settings django-admin migrate --run-syncdb
    DJANGO_SETTINGS_MODULE=examples.django_app.settings django-admin runserver
    worker run examples.django_app.tasks

    curl -X POST localhost:8000/orders -d '{"item": "widget", "quantity": 2}'

`POST /orders` creates the order, enqueues `send_receipt` for it and takes the stock, in one
`transaction.atomic()` block. An order the stock cannot cover raises inside the block after
the enqueue: Django rolls back, and the order and its job are gone together (409).

`tests/test_django_example.py` runs it with Django's test client against a real PostgreSQL.
"""
