"""A Django app of test tasks (installed by tests/contrib/django_settings.py only)."""
