"""Which ``Host`` the dashboard answers: its guard against DNS rebinding.

A web page the operator visits can point its own name (``evil.example``) at 127.0.0.1 once
it has loaded; its scripts then reach a dashboard on loopback as their own origin, and the
browser sends ``Host: evil.example:8080``. Reading needs no token on loopback, so without
this check such a page could read dead letters (arguments, tracebacks), results and the
outbox. The dashboard therefore answers only names a stranger cannot point at it:

* the address it was bound as; on loopback every loopback address, and on a wildcard
  address (``0.0.0.0``, ``::``) every address (an address in the URL is the page's own
  origin, so no other site can share it);
* ``localhost``, which browsers resolve to loopback themselves;
* the names the operator allowed: ``--allow-host NAME`` or the ``dashboard_allowed_hosts``
  setting (``TASKQ_DASHBOARD_ALLOWED_HOSTS``, comma-separated).

Every other ``Host`` (and one that cannot be parsed) gets 400 naming it and how to allow it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

LOCALHOST = "localhost"
_WILDCARDS = ("", "0.0.0.0", "::")
# A Host value: a name or IPv4 address, or a bracketed IPv6 address, and an optional port.
# Anything else (user info, a path, spaces) is refused rather than guessed at.
_HOST_RE = re.compile(r"(?P<name>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return None


def normalize(name: str) -> str:
    """``name`` as compared: lower case, without brackets; an address in its short form."""
    name = name.strip().lower()
    address = _address(name)
    return str(address) if address is not None else name


def split_names(text: str) -> tuple[str, ...]:
    """The names of a comma-separated setting (blanks dropped)."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def hostname(host: str) -> str | None:
    """The name of a ``Host`` value without its port (``None`` when it cannot be parsed)."""
    match = _HOST_RE.fullmatch(host)
    return normalize(match["name"]) if match else None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``localhost`` counts)."""
    if host.strip().lower() == LOCALHOST:
        return True
    address = _address(host)
    return address is not None and address.is_loopback


@dataclass(frozen=True)
class AllowedHosts:
    """The ``Host`` names a dashboard bound to ``bound`` answers.

    Args:
        bound: The address (or name) the server listens on.
        names: Further names the operator allowed (any case).
    """

    bound: str = "127.0.0.1"
    names: tuple[str, ...] = ()

    @classmethod
    def of(cls, bound: str, names: Iterable[str]) -> AllowedHosts:
        """Rules for ``bound`` plus ``names`` (normalized, duplicates dropped)."""
        return cls(bound, tuple(dict.fromkeys(normalize(n) for n in names if n.strip())))

    def allows(self, host: str) -> bool:
        """Whether a request with this ``Host`` value (``name[:port]``) is answered."""
        name = hostname(host)
        if name is None:
            return False
        if name in (LOCALHOST, normalize(self.bound)) or name in self.names:
            return True
        address = _address(name)
        if address is None:
            return False
        if self.bound.strip() in _WILDCARDS:
            return True
        return address.is_loopback and is_loopback(self.bound)

    def describe(self) -> str:
        """What is answered, in words, for the refusal."""
        if self.bound.strip() in _WILDCARDS:
            answered = ["any address of this machine"]
        elif is_loopback(self.bound):
            answered = ["loopback addresses"]
        else:
            answered = [self.bound]
        return ", ".join([*answered, LOCALHOST, *self.names])

    def refusal(self, host: str) -> str:
        """Why a request for ``host`` is refused, and how to allow it."""
        name = hostname(host)
        if name is None:
            return (f"Host {host!r} refused: not a host name or address; this dashboard "
                    f"answers only {self.describe()}")
        return (
            f"Host {host!r} refused: this dashboard answers only {self.describe()}, so that "
            f"a web page cannot point its own name at it and read it (DNS rebinding). If you "
            f"reach the dashboard by the name {name!r}, allow it: taskq dashboard "
            f"--allow-host {name}, or TASKQ_DASHBOARD_ALLOWED_HOSTS={name} (also for "
            "taskq worker --dashboard-port; create_app(allowed_hosts=...) for another "
            "server)"
        )
