"""Orders and stock (no migrations: `migrate --run-syncdb` creates their tables)."""

from django.db import models


class Order(models.Model):
    item = models.TextField()
    quantity = models.PositiveIntegerField()


class Stock(models.Model):
    item = models.TextField(unique=True)
    units = models.PositiveIntegerField()
