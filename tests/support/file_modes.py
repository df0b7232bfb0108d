"""Which files and folders someone other than their owner may read, write or enter.

For the checks that what a services stack or a local run writes is its owner's only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# Group and other permission bits.
NOT_OWNER = 0o077
# Others may pass through a folder (to reach a known name below it) but not list or change it.
PASS_THROUGH = 0o011


def exposed_paths(root: Path, *, passable_root: bool = False) -> list[str]:
    """Every file or folder under `root`, `root` included, that grants its group or others any
    permission, as `"drwxr-xr-x /path"`; symbolic links are not followed (their mode means
    nothing).

    Args:
        root: the folder to walk.
        passable_root: `root` itself may let others pass through (see `PASS_THROUGH`).
    """
    offenders = []

    def check(path: Path, allowed: int = 0) -> None:
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and stat.S_IMODE(mode) & NOT_OWNER & ~allowed:
            offenders.append(f"{stat.filemode(mode)} {path}")

    check(root, PASS_THROUGH if passable_root else 0)
    for folder, folders, files in os.walk(root):
        for name in (*folders, *files):
            check(Path(folder) / name)
    return offenders
