"""Files only their owner may read: the state the services stack and the local runner write.

Task logs, checkpoints, trained models, MLflow artifacts, the metadata and tracking databases
and the servers' own logs hold run data, and a traceback or a config may hold more. So the
processes that write them run with umask `OWNER_ONLY_UMASK` (new files 0600, folders 0700), and
the state folder itself is 0700: run as root, 0711, because the `postgres` OS user must pass
through it to its cluster (stratoflow.services.postgres); it still cannot list or read anything.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from stratoflow.services import postgres

OWNER_ONLY_UMASK = 0o077
OWNER_ONLY_FOLDER = 0o700
PASS_THROUGH_FOLDER = 0o711
NOT_OWNER = 0o077


def private_folder(path: Path) -> Path:
    """Create folder `path` (and missing parents) and make it 0700; returns it."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(OWNER_ONLY_FOLDER)
    return path


def private_state_folder(path: Path) -> Path:
    """Create a state folder that may hold a services stack (0700, or 0711 as root), and take
    group and other permissions off whatever an older version left in it (`restrict_tree`)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(PASS_THROUGH_FOLDER if postgres.as_server_user() else OWNER_ONLY_FOLDER)
    restrict_tree(path)
    return path


def restrict_tree(root: Path) -> int:
    """Take group and other permissions off every file and folder below `root` that has any.

    Symbolic links are left alone, and so is what this user may not change (another user's
    file). Returns how many it changed.
    """
    changed = 0
    for folder, folders, files in os.walk(root):
        for name in (*folders, *files):
            path = Path(folder) / name
            with contextlib.suppress(OSError):
                mode = path.lstat().st_mode
                if not stat.S_ISLNK(mode) and stat.S_IMODE(mode) & NOT_OWNER:
                    path.chmod(stat.S_IMODE(mode) & ~NOT_OWNER)
                    changed += 1
    return changed
