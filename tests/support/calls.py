"""Counting how often a function runs, wherever a module imported it from."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def counting_calls(function: Callable[..., Any]) -> Iterator[list[int]]:
    """Count the calls of `function` in this process, however a module imported it: every
    module-level name bound to it is rebound to a counting wrapper meanwhile. Yields a list
    whose one item is the count so far."""
    count = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return function(*args, **kwargs)

    holders = [
        (module, name)
        for module in list(sys.modules.values())
        for name, value in list(vars(module).items())
        if value is function
    ]
    for module, name in holders:
        setattr(module, name, counted)
    try:
        yield count
    finally:
        for module, name in holders:
            setattr(module, name, function)
