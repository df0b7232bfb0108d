"""`stratoflow benchmark`: its arguments, the benchmark Params' validation before Airflow starts,
and the table it prints. In-process, no Airflow; the real run is in
`tests/integration/test_benchmark_dag.py`."""

from __future__ import annotations

from typing import Any

import pytest

from stratoflow.cli import main, runner
from stratoflow.config.params import benchmark_params, dag_params
from stratoflow.config.parsing import SpecError
from stratoflow.config.spec import load_spec
from stratoflow.config.strategies import STRATEGIES
from stratoflow.training.strategy_benchmark import RULE, recommend


def _must_not_run(*args: Any, **kwargs: Any) -> int:
    raise AssertionError("a refused command must not start Airflow")


def test_flags_and_conf_reach_the_benchmark_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(runner, "run_benchmark", lambda p, conf: calls.append((p, conf)) or 0)

    argv = ["benchmark", "digits", "--epochs", "2", "--strategies", "one_device, mirrored"]
    assert main.main([*argv, "--conf", '{"seed": 7, "epochs": 5}']) == 0

    assert calls == [("digits", {"seed": 7, "epochs": 2, "strategies": ["one_device", "mirrored"]})]


def test_an_unknown_strategy_is_a_usage_error_listing_the_allowed_ones(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "run_benchmark", _must_not_run)
    with pytest.raises(SystemExit) as exit_info:
        main.main(["benchmark", "mnist", "--strategies", "mirrored,warp"])

    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "unknown strategy 'warp'; allowed: " + ", ".join(STRATEGIES) in error


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"strategy": "mirrored"}, "unknown key 'strategy'; allowed: epochs, seed, strategies"),
        ({"strategies": ["warp"]}, "Invalid input for param strategies: 'warp' is not one of"),
        ({"strategies": "mirrored"}, "Invalid input for param strategies: 'mirrored' is not of"),
        ({"tolerance": 2}, "Invalid input for param tolerance: 2 is greater than"),
        ({"tolerance": float("nan")}, "Invalid input for param tolerance: nan should not be"),
        ({"epochs": 0}, "Invalid input for param epochs: 0 is less than the minimum of 1"),
    ],
)
def test_bad_benchmark_conf_is_refused_before_airflow_starts(
    monkeypatch: pytest.MonkeyPatch, conf: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        runner.check_benchmark_conf("digits", conf)
    monkeypatch.setattr(runner, "ensure_airflow_db", _must_not_run)
    assert runner.run_benchmark("digits", conf) == 1


def test_a_regression_pipeline_has_no_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "ensure_airflow_db", _must_not_run)
    with pytest.raises(SpecError, match=r"'diabetes' is a regression pipeline: the strategy"):
        runner.check_benchmark_conf("diabetes", {})
    assert runner.run_benchmark("diabetes", {}) == 1


def test_good_benchmark_conf_passes() -> None:
    runner.check_benchmark_conf(
        "mnist", {"epochs": 2, "seed": 1, "strategies": ["tpu", "one_device"], "tolerance": 0.0}
    )


def test_benchmark_params_share_the_retrain_schemas_and_default_to_every_strategy() -> None:
    spec = load_spec("mnist")
    params = benchmark_params(spec)

    assert list(params) == ["epochs", "seed", "strategies", "tolerance"]
    assert params["epochs"]["default"] == 3
    assert params["seed"] == dag_params(spec)["seed"]
    assert params["strategies"]["default"] == []
    assert params["strategies"]["items"]["enum"] == list(STRATEGIES)
    assert params["tolerance"]["default"] == 0.01


def test_the_printed_table_has_every_strategy_the_failures_and_the_recommendation() -> None:
    rows = [
        {
            "strategy": "one_device",
            "label": "one_device",
            "status": "succeeded",
            "examples_per_second": 5123.4,
            "seconds_to_first_step": 20.5,
            "train_seconds": 3.25,
            "seconds_to_threshold": 1.5,
            "final_val_accuracy": 0.93,
            "test_accuracy": 0.935,
        },
        {
            "strategy": "mirrored",
            "label": "mirrored (2 logical CPUs)",
            "status": "succeeded",
            "examples_per_second": 3000.0,
            "test_accuracy": 0.94,
            "seconds_to_threshold": None,
        },
        {"strategy": "tpu", "label": "tpu", "status": "failed", "error": "no TPU here\nmore"},
    ]
    text = runner.format_benchmark(
        {
            "pipeline": "digits",
            "parent_run_id": "abc123",
            "epochs": 2,
            "seed": 42,
            "threshold": 0.9,
            "rule": RULE.format(tolerance="0.01"),
            "strategies": rows,
            "not_run": {"auto": "an alias of one_device"},
            "recommendation": recommend(rows, 0.01),
        }
    )
    lines = text.splitlines()

    assert "Strategy benchmark of digits (2 epochs, seed 42" in text and "abc123" in text
    one_device = next(line for line in lines if line.startswith("one_device "))
    assert one_device.split() == [
        "one_device", "succeeded", "5123.4", "20.5", "3.2", "1.5", "0.9300", "0.9350"
    ]  # fmt: skip
    assert "not reached" in next(line for line in lines if line.startswith("mirrored (2"))
    assert "  failed: tpu: no TPU here" in lines
    assert "  not run: auto: an alias of one_device" in lines
    assert "Recommended for this host: one_device" in lines
    assert any(line.startswith("  rule: Recommended: of the strategies") for line in lines)


def test_the_benchmark_params_are_declared_once_and_the_flags_read_them() -> None:
    """`stratoflow.config.params.benchmark_params` declares them; the CLI's flags (and the
    benchmark's check of unknown keys) are made from it, so no other module spells their names."""
    import ast
    import inspect

    from stratoflow.config import names

    declared = list(benchmark_params(load_spec("digits")))
    parser = main.build_parser()
    benchmark = parser._subparsers._group_actions[0].choices["benchmark"]  # type: ignore[union-attr]
    flags = {action.dest: action for action in benchmark._actions if action.option_strings}
    assert [name for name in flags if name not in ("help", "conf")] == declared
    assert flags["tolerance"].type is float and flags["epochs"].type is int
    written = {
        node.value
        for node in ast.walk(ast.parse(inspect.getsource(main)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    assert not written & {f"--{name}" for name in declared}, "a flag written by hand in main.py"
    assert not hasattr(names, "BENCHMARK_PARAMS"), "a second list of the names in names.py"
