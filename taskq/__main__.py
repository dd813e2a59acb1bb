"""``python -m taskq``: the same as the ``taskq`` command."""

from __future__ import annotations

from taskq.cli import main

if __name__ == "__main__":
    main()
