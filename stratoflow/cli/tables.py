"""Plain-text tables for the terminal: `stratoflow list`, `compare` and `benchmark` print them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A plain-text table of `rows`: one line per row, `columns` in order, "-" where missing.

    Args:
        rows: the rows, each a mapping from column name to value.
        columns: the columns to show, in order.
    """
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [
        max([len(column)] + [len(line[i]) for line in cells]) for i, column in enumerate(columns)
    ]
    lines = [list(columns), ["-" * width for width in widths], *cells]
    return "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        + "\n"
        for line in lines
    )


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return str(value)
