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


def test_a_training_process_imports_nothing_of_mlflow():
    """Pipeline code runs in it: it reports to its task, which logs (no client, no account)."""
    graph = grimp.build_graph("stratoflow", include_external_packages=True)
    for program in ("stratoflow.training.worker", "stratoflow.distributed.spares"):
        chain = graph.find_shortest_chain(program, "mlflow")
        assert chain is None, chain


def test_a_report_line_is_read_back_and_any_other_line_is_not():
    import io
    from contextlib import redirect_stdout

    from stratoflow.distributed.protocol import EPOCH_REPORT, read_report, report

    printed = io.StringIO()
    with redirect_stdout(printed):
        report(EPOCH_REPORT, {"epoch": 1, "loss": 0.5})
    line = printed.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    assert read_report(line.rstrip("\n")) == (EPOCH_REPORT, {"epoch": 1, "loss": 0.5})
    for other in (
        "epoch 1/3: loss 0.5",
        line[:-10],  # cut short
        'STRATOFLOW-REPORT {"kind": "surprise", "data": {}}',
        'STRATOFLOW-REPORT {"kind": "epoch", "data": [1]}',
    ):
        assert read_report(other) is None, other


def test_the_payload_is_read_as_it_was_written():
    from stratoflow.config.run_plan import resolve_plan

    payload = TrainingPayload(
        plan=resolve_plan("digits", {"epochs": 2}),
        dataset={"name": "digits", "version": "1.0.0"},
        run_dir="/runs/r1",
        system_metrics_seconds=2.0,
    )
    assert TrainingPayload.from_json(payload.to_json()) == payload


def test_a_result_with_a_key_the_type_does_not_know_is_refused():
    """A member and a task of different versions fail loudly, not with a silently lost field."""
    result = TrainingResult("m.keras", "one_device", "custom", 1, 1, 64, 2, 0)
    assert TrainingResult.from_dict(result.to_dict()) == result
    with pytest.raises(TypeError, match="surprise"):
        TrainingResult.from_dict({**result.to_dict(), "surprise": 1})
