"""Warm spares (`stratoflow.distributed.spares`) on their own; a spare that replaces a killed
member is tested in `test_launcher_multiprocess.py`."""

from __future__ import annotations

import logging
import os
import time

import pytest

from stratoflow.distributed.member_environment import pipeline_environment
from stratoflow.distributed.spares import Spares, wanted_for


def test_a_cluster_keeps_one_spare_per_member_unless_a_lost_member_rejoins_alone() -> None:
    assert wanted_for(rejoining_members=0, members=2) == 2  # multi_worker_mirrored
    assert wanted_for(rejoining_members=2, members=4) == 1  # parameter_server
    assert wanted_for(rejoining_members=0, members=1) == 1  # one process


@pytest.mark.integration
def test_a_spare_that_dies_unused_ends_the_spares_of_the_run_and_says_why() -> None:
    """No loop of spares started and dying: the first one's death stops them, with its reason."""
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("stratoflow.distributed.spares").addHandler(handler)
    spares = Spares(pipeline_environment(os.environ))
    try:
        spares.fill(2, "tests.support.no_such_member_program")
        started = [spare.process for spare in spares.waiting]
        assert len(started) == 2
        deadline = time.monotonic() + 60
        while any(process.poll() is None for process in started):
            assert time.monotonic() < deadline, "the spares did not exit"
            time.sleep(0.05)
        for _ in range(3):  # the supervision calls fill every 0.1 s
            spares.fill(2, "tests.support.no_such_member_program")
        assert spares.waiting == []
        assert spares.take("tests.support.no_such_member_program") is None
    finally:
        spares.close()
        logging.getLogger("stratoflow.distributed.spares").removeHandler(handler)
    (warning,) = said
    assert "exited with status 1 before use: no more spares in this run" in warning
    assert "No module named 'tests.support.no_such_member_program'" in warning
