"""Django's outbox adapter writes where the relay reads, or refuses (issue 26, 3.12).

``settings.TASKQ`` may name a ``database_url`` that is not the database of the alias whose
transactions enqueue (``TASKQ["database"]``): before the check, ``delay()`` inside
``atomic()`` wrote the row through Django's cursor into a table no relay reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from taskq import App, ConfigurationError
from tests.conftest import postgres_schema
from tests.contrib.conftest import count_rows, schema_url


@pytest.fixture
def relay_elsewhere(shop_app: App) -> Iterator[str]:
    """The app's database_url moved to another schema for the test; put back afterwards."""
    kept = shop_app.settings.database_url
    with postgres_schema("tqrelay") as schema:
        shop_app.configure(database_url=schema_url(schema))
        try:
            yield schema
        finally:
            shop_app.configure(database_url=kept)


def test_delay_in_atomic_on_another_database_than_database_url_is_refused(
    shop_app: App, django_schema: str, relay_elsewhere: str, broker: Any, namespace: str
) -> None:
    from django.db import transaction

    from tests.contrib.djapp.tasks import note

    with pytest.raises(ConfigurationError) as refused, transaction.atomic():
        note.delay(1)

    message = str(refused.value)
    assert f"task {note.name!r}" in message
    assert f"search_path%3D{django_schema}" in message  # where Django's cursor writes
    assert f"search_path%3D{relay_elsewhere}" in message  # database_url
    assert count_rows(schema_url(django_schema), "taskq_outbox") == 0
    assert count_rows(schema_url(relay_elsewhere), "taskq_outbox") == 0
    assert shop_app.relay().run_once() == 0
    assert not broker.exists(f"{namespace}.default")


def test_a_django_tasks_enqueue_on_another_database_is_refused(
    shop_app: App, django_schema: str, relay_elsewhere: str
) -> None:
    from django.db import transaction
    from orders.views import place_order

    with pytest.raises(ConfigurationError, match="would never be published"), \
            transaction.atomic():
        place_order("ada@example.com", 4200)

    assert count_rows(schema_url(django_schema), "taskq_outbox") == 0


def test_the_django_connection_of_database_url_is_accepted(
    shop_app: App, django_schema: str
) -> None:
    from django.db import transaction

    from tests.contrib.djapp.tasks import note

    with transaction.atomic():
        note.delay(1)

    assert count_rows(schema_url(django_schema), "taskq_outbox") == 1
