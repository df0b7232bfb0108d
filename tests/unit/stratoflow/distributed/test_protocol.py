"""The contract between a launcher and its members lives in a small module of its own: the
training process and the servers do not load the supervisor, and what crosses the boundary
is typed and survives its one serialisation."""

from __future__ import annotations

import grimp
import pytest

from stratoflow.distributed.protocol import TrainingPayload, TrainingResult

SUPERVISOR = "stratoflow.distributed.launcher"


@pytest.mark.parametrize(
    "member_program",
    ["stratoflow.training.worker", "stratoflow.distributed.server", "stratoflow.training.trainer"],
)
def test_a_member_program_does_not_import_the_supervisor(member_program):
    """Not even through a function-local import (grimp counts those too)."""
    graph = grimp.build_graph("stratoflow")
    assert SUPERVISOR not in graph.find_upstream_modules(member_program), graph.find_shortest_chain(
        member_program, SUPERVISOR
    )


def test_the_payload_is_read_as_it_was_written():
    from stratoflow.config.run_plan import resolve_plan

    payload = TrainingPayload(
        plan=resolve_plan("digits", {"epochs": 2}),
        dataset={"name": "digits", "version": "1.0.0"},
        run_dir="/runs/r1",
        tracking_uri="http://127.0.0.1:5000",
        mlflow_run_id="abc",
    )
    assert TrainingPayload.from_json(payload.to_json()) == payload


def test_a_result_with_a_key_the_type_does_not_know_is_refused():
    """A member and a task of different versions fail loudly, not with a silently lost field."""
    result = TrainingResult("m.keras", "one_device", "custom", 1, 1, 64, 2, 0)
    assert TrainingResult.from_dict(result.to_dict()) == result
    with pytest.raises(TypeError, match="surprise"):
        TrainingResult.from_dict({**result.to_dict(), "surprise": 1})
