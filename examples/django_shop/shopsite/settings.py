"""Settings of the example shop: SQLite by default, PostgreSQL when SHOP_DATABASE_NAME is set.

``TASKS`` runs ``django.tasks`` functions on taskq (``TaskqBackend``).

taskq's broker and other settings come from ``TASKQ_*`` environment variables
(``TASKQ_BROKER_URL``...) unless ``TASKQ`` below names them.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "django-shop-example-only-not-a-secret"
DEBUG = True
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]

INSTALLED_APPS = [
    "taskq.contrib.django",
    "orders",
]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "shopsite.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if os.environ.get("SHOP_DATABASE_NAME"):
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ["SHOP_DATABASE_NAME"],
            "USER": os.environ.get("SHOP_DATABASE_USER", ""),
            "PASSWORD": os.environ.get("SHOP_DATABASE_PASSWORD", ""),
            "HOST": os.environ.get("SHOP_DATABASE_HOST", "localhost"),
            "PORT": os.environ.get("SHOP_DATABASE_PORT", ""),
            # e.g. "-csearch_path=shop" (taskq's relay connects with the same options)
            "OPTIONS": {"options": os.environ.get("SHOP_DATABASE_OPTIONS", "")},
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SHOP_SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
        }
    }

TASKQ = {
    "app": "shopsite.taskq_app:app",
    # Any taskq setting by name, e.g. "broker_url": "amqp://...", "default_queue": "shop".
}

# django.tasks (Django 6; the django-tasks backport before): taskq runs the @task functions.
TASKS = {
    "default": {
        "BACKEND": "taskq.contrib.django.tasks.TaskqBackend",
        "QUEUES": ["default"],  # Django's "default" is TASKQ's default_queue
        # Defaults of taskq's task options; @task(max_retries=...) overrides them.
        "OPTIONS": {"max_retries": 0, "time_limit_s": 300},
    }
}

SHOP_NAME = "Django shop"
