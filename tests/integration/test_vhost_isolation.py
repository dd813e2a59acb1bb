"""A vhost per app isolates apps whose queue names collide (docs/guide.md, "What is on the
broker"): the recipe the docs give, on a private RabbitMQ node (vhosts are broker
configuration, so the shared broker is left alone).

Two apps with the default namespace and the default queue ``default``: in one vhost they
meet in one queue; each in a vhost of its own, each has its own, and ``taskq teardown`` of
one leaves the other's messages alone. Slow: it boots a node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taskq import App
from tests.support.broker import BrokerAdmin
from tests.support.rabbitmq_nodes import RabbitCluster
from tests.system.workers import ROOT


@pytest.fixture
def node() -> Iterator[Any]:
    with RabbitCluster(1) as cluster:
        cluster.start()
        node = cluster.nodes[0]
        for vhost in ("shop", "blog"):
            node.ctl("add_vhost", vhost)
            node.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield node


def plain_app(name: str, url: str) -> App:
    """An app as a newcomer writes it: no namespace, no queue names of its own."""
    app = App(name, broker_url=url, database_url="sqlite://")
    app.task(name=f"{name}.hello", idempotent=False)(lambda: None)
    return app


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_vhost_each_keeps_apps_with_the_same_queue_names_apart(
    node: Any, tmp_path: Path
) -> None:
    root_url = node.url
    base = root_url.rsplit("/", 1)[0]
    # In one vhost the two apps share the queue `default`
    together = [plain_app(name, root_url) for name in ("shop", "blog")]
    for app in together:
        next(iter(app.registry)).delay()
    # Each in its own vhost, each has its own
    apart = {name: plain_app(name, f"{base}/{name}") for name in ("shop", "blog")}
    for app in apart.values():
        next(iter(app.registry)).delay()
    (tmp_path / "shop_app.py").write_text(
        "from taskq import App\napp = App('shop', database_url='sqlite://')\n"
    )

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "TASKQ_BROKER_URL": f"{base}/shop"}
    done = subprocess.run(
        [sys.executable, "-m", "taskq", "teardown", "-A", "shop_app:app", "--yes"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )

    shared, shop, blog = (BrokerAdmin(url) for url in (root_url, f"{base}/shop", f"{base}/blog"))
    try:
        assert shared.depth("default") == 2            # both apps' messages in one queue
        assert done.returncode == 0, done.stderr
        assert not shop.exists("default")               # shop's vhost is empty again
        assert blog.depth("default") == 1               # blog's own message is untouched
    finally:
        for app in (*together, *apart.values()):
            app.close()
        for admin in (shared, shop, blog):
            admin.close()
