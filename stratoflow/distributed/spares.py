"""Warm spares: processes that imported TensorFlow ahead of time and wait to replace a lost member.

Most of a recovery is a new process importing TensorFlow (docs/BENCHMARKS.md, "Recovery"). With a
run's `warm_spares` on, the local launcher keeps spares once training runs: one for a
parameter-server cluster (a lost worker rejoins in place, one at a time), one per member for the
others (a loss restarts every member). A spare is `python -m stratoflow.distributed.spares`: it
imports TensorFlow as a member does (`lean_tensorflow`), then blocks on its stdin. The launcher
hands it a member's command and environment on one line; it takes them on and runs the member's
module as `python -m` would. An unused spare is killed with the cluster (and dies with its parent).

The supervisor's side is `Spares`; the spare's is `main`.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from typing import Any

from stratoflow.distributed.processes import die_with_parent
from stratoflow.distributed.protocol import announce

logger = logging.getLogger(__name__)

# A spare prints this line once TensorFlow is imported and it waits for a member to become.
WARM_MARKER = "STRATOFLOW-SPARE-WARM"
MODULE = "stratoflow.distributed.spares"


class Spare:
    """One started spare, its output read by a thread until it becomes a member."""

    def __init__(self, env: Mapping[str, str]):
        import signal

        self.warm = False
        self._sink: Callable[[str], None] = self._before_use
        self.process = subprocess.Popen(
            [sys.executable, "-m", MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=dict(env),
            preexec_fn=die_with_parent(signal.SIGKILL),
        )
        self.reader = threading.Thread(target=self._read, daemon=True, name="spare-output")
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            self._sink(raw.rstrip())

    def _before_use(self, line: str) -> None:
        if line == WARM_MARKER:
            self.warm = True
            logger.info("warm spare ready (pid %d)", self.process.pid)
        else:
            logger.debug("[spare pid %d] %s", self.process.pid, line)

    def become(
        self, command: list[str], env: Mapping[str, str], sink: Callable[[str], None]
    ) -> None:
        """Run `command` (`python -m MODULE ARGS...`) with `env` in this process; its output now
        goes to `sink`."""
        assert self.process.stdin is not None
        self._sink = sink
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

    def fill(self, wanted: int) -> None:
        """Start spares until `wanted` are waiting (a dead one is replaced)."""
        for spare in [s for s in self.waiting if not s.alive()]:
            logger.warning("warm spare pid %d exited before use", spare.process.pid)
            self.waiting.remove(spare)
        while len(self.waiting) < wanted:
            spare = Spare(self.env)
            logger.info("starting a warm spare (pid %d)", spare.process.pid)
            self.waiting.append(spare)

    def take(self) -> Spare | None:
        """A waiting spare (the warm ones first), or None."""
        alive = [s for s in self.waiting if s.alive()]
        if not alive:
            return None
        spare = next((s for s in alive if s.warm), alive[0])
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
    """The spare's side: import TensorFlow, wait for a member's command, run it."""
    from stratoflow.distributed import lean_tensorflow

    lean_tensorflow.import_tensorflow()
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
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
