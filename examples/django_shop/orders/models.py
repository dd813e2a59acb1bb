from __future__ import annotations

from django.db import models


class Order(models.Model):
    email = models.CharField(max_length=255)
    total_cents = models.IntegerField()
    confirmation = models.TextField(null=True)
