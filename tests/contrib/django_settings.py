"""Django settings of the contrib tests: the example shop's, plus the test tasks' app."""

from __future__ import annotations

from shopsite.settings import *  # noqa: F403
from shopsite.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.contrib.djapp"]
