"""The stack's own files: state and secrets written owner-only, the last lines of a log.

Its processes are remembered and stopped by `stratoflow.distributed.processes`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 40


def write_private(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON readable by the owner only (created 0600, never world-readable meanwhile)."""
    write_private_text(path, json.dumps(data, indent=1))


def write_private_text(path: Path, text: str) -> None:
    """Write `text` readable by the owner only (created 0600, never world-readable meanwhile)."""
    temporary = path.with_suffix(".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as stream:
        stream.write(text)
    os.replace(temporary, path)


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log file, or "" if it cannot be read."""
    try:
        return last_lines(path.read_text(errors="replace"), lines)
    except OSError:
        return ""


def last_lines(text: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of `text` (a command's output quoted in an error)."""
    return "\n".join(text.strip().splitlines()[-lines:])
