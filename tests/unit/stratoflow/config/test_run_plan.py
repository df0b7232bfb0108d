"""A run's plan: resolved and validated once, then carried as itself; what comes back from JSON
is checked to be a plan (keys, types, members) and never validated again."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from stratoflow.config import training
from stratoflow.config.parsing import SpecError
from stratoflow.config.run_plan import PlanError, RunPlan, resolve_plan
from stratoflow.distributed.protocol import TrainingPayload
from tests.support.calls import counting_calls

ROOT = Path(__file__).resolve().parents[4]


def test_a_plan_holds_the_spec_the_settings_the_members_and_where_it_runs() -> None:
    plan = resolve_plan("digits", {"strategy": "multi_worker_mirrored", "epochs": 3})
    assert (plan.pipeline, plan.training.epochs, plan.launcher) == ("digits", 3, "local")
    assert [m.name for m in plan.cluster.members] == ["worker 0", "worker 1"]
    assert plan.cluster.result_from == "worker 0"
    assert plan.runs_on == ""  # this task's host
    with pytest.raises(AttributeError):
        plan.spec = plan.spec  # type: ignore[misc]  # frozen


def test_resolving_checks_the_training_settings_once() -> None:
    with counting_calls(training.check_training) as checks:
        resolve_plan("digits", {"epochs": 2})
    assert checks[0] == 1


def test_a_bad_default_in_the_spec_is_named_as_the_spec_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked together with the conf, but a default at fault is blamed on its file."""
    import yaml

    from stratoflow.config.spec import SPECS_DIR

    data = yaml.safe_load((SPECS_DIR / "digits" / "pipeline.yaml").read_text())
    data["training"] = {**data.get("training", {}), "batch_size": 33, "strategy": "mirrored"}
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("STRATOFLOW_PIPELINES_PATH", str(tmp_path))
    with pytest.raises(SpecError, match=r"odd/pipeline\.yaml: training\.batch_size 33 must be"):
        resolve_plan("odd", {"epochs": 2})
    assert resolve_plan("odd", {"batch_size": 32}).training.batch_size == 32


def test_the_plan_comes_back_from_json_as_it_was_without_a_second_check() -> None:
    plan = resolve_plan("digits", {"strategy": "parameter_server", "workers": 3})
    payload = TrainingPayload(plan, {"name": "d"}, "/runs/r1", system_metrics_seconds=2.0)
    with counting_calls(training.check_training) as checks:
        assert RunPlan.from_json(plan.to_json()) == plan
        assert TrainingPayload.from_json(payload.to_json()).plan == plan  # what a member reads
    assert checks[0] == 0


def _edited(plan: RunPlan, path: str, value: Any) -> dict[str, Any]:
    data = json.loads(plan.to_json())
    *parents, key = path.split(".")
    target = data
    for parent in parents:
        target = target[int(parent)] if isinstance(target, list) else target[parent]
    target[key] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("training.epochs", "3", r"training\.epochs: expected int, got str"),
        ("training.strategy", "bogus", r"training\.strategy 'bogus' is not allowed; allowed: "),
        ("training.surprise", 1, r"training: unknown key 'surprise'"),
        ("training.workers", 4, r"cluster is not the members its training settings plan"),
        # A member's program is what the launcher runs (`python -m MODULE`): only the planned one.
        ("cluster.members.0.module", "os", r"cluster is not the members its training settings"),
        ("cluster.members", "worker 0", r"cluster\.members: expected a list, got str"),
        ("cluster.result_from", 0, r"cluster\.result_from: expected str, got int"),
    ],
)
def test_a_hand_edited_plan_is_refused_naming_the_field(
    path: str, value: Any, message: str
) -> None:
    plan = resolve_plan("digits", {"strategy": "multi_worker_mirrored"})
    with pytest.raises(PlanError, match=rf"^run_config[.:] ?{message}"):
        RunPlan.from_dict(_edited(plan, path, value), "run_config")


def test_a_plan_that_is_not_json_or_not_a_mapping_is_refused() -> None:
    with pytest.raises(PlanError, match="the payload: not JSON"):
        RunPlan.from_json("{", "the payload")
    with pytest.raises(PlanError, match="the payload: expected a mapping, got list"):
        RunPlan.from_json("[]", "the payload")


def test_the_run_plan_module_stays_light() -> None:
    """The DAG files import it at parse time: no TensorFlow, Keras, MLflow or Airflow import at
    the top of it or of the modules it imports from the engine."""
    heavy = ("tensorflow", "keras", "mlflow", "airflow")
    for module in ("run_plan", "model_builders"):
        tree = ast.parse((ROOT / "stratoflow" / "config" / f"{module}.py").read_text())
        top_level = [
            alias.name if isinstance(node, ast.Import) else node.module or ""
            for node in tree.body
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        ]
        assert not [name for name in top_level if name.split(".")[0] in heavy], module
