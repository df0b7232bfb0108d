"""Warm spares: processes that imported TensorFlow ahead of time and wait to replace a lost member.

Most of a recovery is a new process importing TensorFlow (docs/BENCHMARKS.md, "Recovery"). With a
run's `warm_spares` on, the launchers keep spares once training runs. The local one keeps one
for a parameter-server cluster (a lost worker rejoins in place, one at a time) and one per member
for the others (a loss restarts every member); the Ray one keeps a spare in every member's
actor, of that member's program (`ray_launcher.MemberHost.keep_spare`, a `Spares` of its own).

A spare is `python -m stratoflow.distributed.spares MODULE`: it imports TensorFlow as a member
does (`lean_tensorflow`), and what member program MODULE would import (its `import_ahead`, if it
has one), then blocks on its stdin. The launcher hands it a member's command and environment on
one line; it takes them on and runs the member's module as `python -m` would. An unused spare
is killed with the cluster (and dies with its parent).

The supervisor's side is `Spares`; the spare's is `main`.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import runpy
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from stratoflow.distributed.processes import start_reading_lines
from stratoflow.distributed.protocol import announce

logger = logging.getLogger(__name__)

# A spare prints this line once TensorFlow is imported and it waits for a member to become.
WARM_MARKER = "STRATOFLOW-SPARE-WARM"
MODULE = "stratoflow.distributed.spares"
# The lines of a spare's output kept to say why it died unused.
TAIL_LINES = 20


class Spare:
    """One started spare, its output read by a thread until it becomes a member."""

    def __init__(self, env: Mapping[str, str], module: str):
        self.module = module
        self.warm = False
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._sink: Callable[[str], None] = self._before_use
        # Through `_sink`, which `become` turns to the member's reader.
        self.process, self.reader = start_reading_lines(
            [sys.executable, "-m", MODULE, module],
            env,
            lambda line: self._sink(line),
            stdin=subprocess.PIPE,
        )

    def _before_use(self, line: str) -> None:
        if line == WARM_MARKER:
            self.warm = True
            logger.info("warm spare ready (pid %d)", self.process.pid)
        else:
            self.tail.append(line)
            logger.debug("[spare pid %d] %s", self.process.pid, line)

    def become(
        self, command: list[str], env: Mapping[str, str], sink: Callable[[str], None]
    ) -> None:
        """Run `command` (`python -m MODULE ARGS...`) with `env` in this process; its output now
        goes to `sink`."""
        assert self.process.stdin is not None
        # A spare still importing announces it is warm after the handover: not the member's.
        self._sink = lambda line: None if line == WARM_MARKER else sink(line)
        self.process.stdin.write(json.dumps({"command": command, "env": dict(env)}) + "\n")
        self.process.stdin.close()

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


class Spares:
    """A run's warm spares: started when training runs, taken by members that start again.

    Args:
        env: the environment a spare starts in (the members' allowlisted one); a member's own
            environment replaces it when the spare becomes that member.
    """

    def __init__(self, env: Mapping[str, str]):
        self.env = dict(env)
        self.waiting: list[Spare] = []
        # Set when a spare died unused: the next would too (the same program and environment),
        # so the run goes on without spares rather than starting them in a loop.
        self.given_up = False

    def fill(self, wanted: int, module: str) -> None:
        """Start spares for member program `module` until `wanted` are waiting; none any more
        once one died unused."""
        for spare in [s for s in self.waiting if not s.alive()]:
            self.waiting.remove(spare)
            if not self.given_up:
                spare.reader.join(timeout=5)  # its last lines say why
                logger.warning(
                    "warm spare pid %d exited with status %s before use: no more spares in this "
                    "run. Its last lines:\n%s",
                    spare.process.pid,
                    spare.process.returncode,
                    "\n".join(spare.tail),
                )
            self.given_up = True
        while not self.given_up and len(self.waiting) < wanted:
            spare = Spare(self.env, module)
            logger.info("starting a warm spare (pid %d)", spare.process.pid)
            self.waiting.append(spare)

    def take(self, module: str) -> Spare | None:
        """A waiting spare, or None: the warm ones for member program `module` first (any spare
        can run any member program; one made for it imported more ahead)."""
        alive = [s for s in self.waiting if s.alive()]
        if not alive:
            return None
        spare = min(alive, key=lambda s: (not s.warm, s.module != module))
        self.waiting.remove(spare)
        return spare

    def close(self) -> None:
        """Kill the spares that were not used."""
        for spare in self.waiting:
            spare.kill()
        self.waiting.clear()


def wanted_for(rejoining_members: int, members: int) -> int:
    """How many spares a cluster keeps: one where a lost member rejoins alone (a
    parameter-server worker), else one per member (a loss restarts them all)."""
    return 1 if rejoining_members else members


def main() -> None:
    """The spare's side: import TensorFlow and what member program `sys.argv[1]` imports, wait
    for a member's command, run it."""
    import importlib

    from stratoflow.distributed import lean_tensorflow

    member_program = importlib.import_module(sys.argv[1])  # light: its imports are in functions
    lean_tensorflow.import_tensorflow()
    getattr(member_program, "import_ahead", lambda: None)()
    announce(WARM_MARKER)
    line = sys.stdin.readline()
    if not line:  # the launcher went away or closed the pool
        return
    order: dict[str, Any] = json.loads(line)
    os.environ.clear()
    os.environ.update(order["env"])
    tempfile.tempdir = None  # the member's TMPDIR, not the spare's
    module, *arguments = order["command"][2:]  # [python, "-m", MODULE, ARGS...]
    sys.argv = [module, *arguments]
    # runpy warns that MODULE was imported before it runs as __main__: the spare did so on
    # purpose (its imports ahead); the member runs in a fresh `__main__` all the same.
    warnings.filterwarnings(
        "ignore", message=".*found in sys.modules after import of package", category=RuntimeWarning
    )
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
