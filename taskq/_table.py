"""Plain-text tables for the CLI: each column as wide as its widest cell (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def aligned(
    rows: Sequence[Sequence[str]], *, right: Collection[int] = (), indent: str = "  "
) -> list[str]:
    """Lines of ``rows`` (the first is the header) with their columns lined up.

    Args:
        rows: Cells as strings; every row has the same number of cells.
        right: Indexes of the columns aligned right (numbers).
        indent: Put before every line.

    Returns:
        One line per row; the last column is not padded, so lines carry no trailing blanks.
    """
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    last = len(widths) - 1
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else (cell if i == last else cell.ljust(widths[i]))
            for i, cell in enumerate(row)
        ]
        lines.append(indent + "  ".join(cells))
    return lines
