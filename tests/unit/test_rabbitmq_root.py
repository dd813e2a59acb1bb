"""Where the tests' private RabbitMQ nodes come from: the machine's install or a Debian root."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.rabbitmq_nodes import node_config
from tests.support.rabbitmq_root import HOST, ROOT_ENV, RabbitInstall, requested_install


def fake_root(tmp_path: Path, version: str) -> RabbitInstall:
    (tmp_path / "usr/lib/rabbitmq/lib" / f"rabbitmq_server-{version}").mkdir(parents=True)
    (tmp_path / "tmp").mkdir()
    return RabbitInstall(tmp_path)


def test_the_root_is_used_only_when_the_run_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROOT_ENV, raising=False)
    assert requested_install() is HOST

    monkeypatch.setenv(ROOT_ENV, "/opt/rmq43")
    assert requested_install().root == Path("/opt/rmq43")


def test_a_node_in_a_root_keeps_its_files_inside_and_gets_only_the_variables_given(
    tmp_path: Path,
) -> None:
    install = fake_root(tmp_path, "4.3.6")
    folder = install.make_dir("taskq-nodes-")

    argv, _ = install.command("rabbitmqctl", "-n", "r@localhost",
                              env={"HOME": install.seen(folder / "home")})

    assert folder.parent == tmp_path / "tmp"
    assert argv[:5] == ["chroot", str(tmp_path), "env", "-i", argv[4]]
    assert f"HOME=/tmp/{folder.name}/home" in argv
    assert argv[-3:] == ["/usr/lib/rabbitmq/bin/rabbitmqctl", "-n", "r@localhost"]
    assert not any(item.startswith("ERL_FLAGS=") for item in argv)


def test_the_epmd_of_a_root_is_its_own_on_the_port_given(tmp_path: Path) -> None:
    install = fake_root(tmp_path, "4.3.6")

    assert install.epmd_command(41234) == [
        "chroot", str(tmp_path), "/usr/bin/epmd", "-port", "41234", "-address", "127.0.0.1"]


@pytest.mark.parametrize(("version", "pause_minority"), [
    ("3.10.8", True), ("4.0.5", True), ("4.2.1", False), ("4.3.6", False)])
def test_pause_minority_is_set_only_where_the_broker_keeps_metadata_in_mnesia(
    tmp_path: Path, version: str, pause_minority: bool,
) -> None:
    install = fake_root(tmp_path, version)

    clustered = node_config(5700, ["a@localhost", "b@localhost", "c@localhost"], install)
    alone = node_config(5700, ["a@localhost"], install)

    assert install.version() == version
    assert ("cluster_partition_handling = pause_minority" in clustered) is pause_minority
    assert "cluster_formation.classic_config.nodes.3 = c@localhost" in clustered
    assert "cluster_" not in alone
