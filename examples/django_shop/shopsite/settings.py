"""Settings of the example shop: SQLite by default, PostgreSQL when SHOP_DATABASE_NAME is set.

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

SHOP_NAME = "Django shop"
