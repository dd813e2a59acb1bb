"""Which ``Host`` values the dashboard answers for each address it is bound as."""

from __future__ import annotations

import pytest

from taskq.dashboard.hosts import AllowedHosts, hostname, split_names

LOOPBACK = AllowedHosts.of("127.0.0.1", [])
WILDCARD = AllowedHosts.of("0.0.0.0", [])
ADDRESS = AllowedHosts.of("10.0.0.5", [])
NAMED = AllowedHosts.of("dash.internal", ["Ops.Example", "[::1]"])

ANSWERED = [
    (LOOPBACK, "127.0.0.1:8080"), (LOOPBACK, "127.0.0.1"), (LOOPBACK, "127.1.2.3:8080"),
    (LOOPBACK, "[::1]:8080"), (LOOPBACK, "localhost:8080"), (LOOPBACK, "LOCALHOST"),
    (AllowedHosts.of("::1", []), "[0:0:0:0:0:0:0:1]:80"),
    (WILDCARD, "10.0.0.5:8080"), (WILDCARD, "[fe80::1]:8080"), (WILDCARD, "localhost"),
    (ADDRESS, "10.0.0.5:8080"), (ADDRESS, "localhost:8080"),
    (NAMED, "dash.internal:8080"), (NAMED, "ops.example"), (NAMED, "[::1]:9"),
]
REFUSED = [
    (LOOPBACK, "evil.example:8080"), (LOOPBACK, "evil.example"), (LOOPBACK, "10.0.0.5:8080"),
    (LOOPBACK, "localhost.evil.example"), (LOOPBACK, "127.0.0.1.nip.io"),
    (LOOPBACK, "evil.example@127.0.0.1"), (LOOPBACK, "127.0.0.1 evil"), (LOOPBACK, ""),
    (LOOPBACK, "[::1"), (LOOPBACK, "2130706433"),
    (WILDCARD, "evil.example:8080"), (ADDRESS, "10.0.0.6"), (ADDRESS, "127.0.0.1"),
    (NAMED, "evil.example"), (NAMED, "sub.ops.example"), (NAMED, "127.0.0.1"),
]


@pytest.mark.parametrize(("hosts", "host"), ANSWERED)
def test_the_names_it_was_bound_as_are_answered(hosts: AllowedHosts, host: str) -> None:
    assert hosts.allows(host)


@pytest.mark.parametrize(("hosts", "host"), REFUSED)
def test_other_names_are_refused(hosts: AllowedHosts, host: str) -> None:
    assert not hosts.allows(host)


def test_a_refusal_names_the_host_and_how_to_allow_it() -> None:
    why = LOOPBACK.refusal("Evil.Example:8080")
    assert "'Evil.Example:8080' refused" in why
    assert "loopback addresses, localhost" in why
    assert "--allow-host evil.example" in why
    assert "TASKQ_DASHBOARD_ALLOWED_HOSTS=evil.example" in why
    assert "not a host name" in LOOPBACK.refusal("a b")


def test_names_parse_as_the_setting_and_the_header_give_them() -> None:
    assert split_names(" a.example, ,B.example ") == ("a.example", "B.example")
    assert hostname("[::1]:8080") == "::1"
    assert hostname("Dash.Example:1") == "dash.example"
    assert hostname("x/y") is None
