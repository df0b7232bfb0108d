"""The strategy benchmark's rules, without TensorFlow: which strategies a host runs, the figures
taken from a run's history, and the recommendation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stratoflow.config.spec import load_spec
from stratoflow.config.training import resolve_training
from stratoflow.training.strategy_benchmark import (
    RULE,
    HostDevices,
    comparison_markdown,
    model_has_random_layers,
    plan_strategies,
    recommend,
    steady_throughput,
    threshold_reached,
)

CPU_ONLY = HostDevices()


def names(planned):
    return [entry["strategy"] for entry in planned]


def test_cpu_host_runs_every_strategy_but_tpu_and_the_auto_alias_on_a_dropout_free_model():
    spec = load_spec("mnist")  # small_cnn without dropout
    planned, not_run = plan_strategies(spec, [], CPU_ONLY)

    assert names(planned) == [
        "one_device",
        "mirrored",
        "multi_worker_mirrored",
        "parameter_server",
        "central_storage",
    ]
    assert set(not_run) == {"tpu", "auto"}
    assert "no TPU" in not_run["tpu"]
    assert "one_device" in not_run["auto"]
    by_name = {entry["strategy"]: entry for entry in planned}
    assert by_name["mirrored"]["label"] == "mirrored (2 logical CPUs)"
    assert by_name["parameter_server"]["label"] == "parameter_server (2 workers + 1 ps)"
    for entry in planned:
        overrides = entry["overrides"]
        assert overrides["strategy"] == entry["strategy"]
        assert (overrides["loop"], overrides["cluster"]) == ("custom", "")
        assert entry["unavailable"] is None
        # Every planned entry is a valid training config for the pipeline.
        resolve_training(spec.training, overrides)


def test_central_storage_is_left_out_when_the_model_has_dropout():
    spec = load_spec("digits")  # mlp with dropout 0.1
    assert model_has_random_layers(spec)
    planned, not_run = plan_strategies(spec, [], CPU_ONLY)

    assert "central_storage" not in names(planned)
    assert "Dropout" in not_run["central_storage"]
    assert not model_has_random_layers(load_spec("mnist"))


def test_a_host_with_a_tpu_and_gpus_plans_tpu_and_mirrors_over_its_gpus():
    planned, not_run = plan_strategies(load_spec("mnist"), [], HostDevices(gpus=4, tpus=1))

    assert "tpu" in names(planned)
    assert "tpu" not in not_run
    assert "mirrored" in not_run["auto"]
    assert {e["strategy"]: e["label"] for e in planned}["mirrored"] == "mirrored (4 GPUs)"


def test_a_batch_that_two_replicas_cannot_split_leaves_the_splitting_strategies_out():
    spec = load_spec("mnist")
    odd = replace(spec, training=replace(spec.training, batch_size=63))
    planned, not_run = plan_strategies(odd, [], CPU_ONLY)

    assert names(planned) == ["one_device", "parameter_server"]
    for name in ("mirrored", "central_storage", "multi_worker_mirrored"):
        assert "batch_size 63" in not_run[name], name


def test_requested_strategies_run_in_order_and_an_impossible_one_carries_its_reason():
    planned, not_run = plan_strategies(
        load_spec("digits"), ["mirrored", "tpu", "one_device", "mirrored"], CPU_ONLY
    )

    assert names(planned) == ["mirrored", "tpu", "one_device"]
    assert not_run == {}
    unavailable = {entry["strategy"]: entry["unavailable"] for entry in planned}
    assert unavailable["mirrored"] is None and unavailable["one_device"] is None
    assert "no TPU" in unavailable["tpu"]


def test_an_unknown_requested_strategy_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match="'warp' is not allowed; allowed: auto, one_device"):
        plan_strategies(load_spec("digits"), ["warp"], CPU_ONLY)


def test_throughput_is_the_median_after_the_first_epoch():
    assert steady_throughput([100.0, 900.0, 1000.0, 1200.0]) == 1000.0
    assert steady_throughput([100.0, 900.0]) == 900.0
    assert steady_throughput([400.0]) == 400.0  # one epoch: that one
    assert steady_throughput([]) is None


def test_threshold_is_the_first_epoch_reaching_it_with_the_seconds_so_far():
    history = [
        {"epoch": 1, "seconds": 4.0, "val_accuracy": 0.80},
        {"epoch": 2, "seconds": 3.0, "val_accuracy": 0.91},
        {"epoch": 3, "seconds": 3.0, "val_accuracy": 0.95},
    ]
    assert threshold_reached(history, 0.9) == {"epoch": 2, "seconds": 7.0}
    assert threshold_reached(history, 0.80) == {"epoch": 1, "seconds": 4.0}
    assert threshold_reached(history, 0.99) is None


def row(strategy, accuracy, speed, status="succeeded", train_seconds=10.0):
    return {
        "strategy": strategy,
        "status": status,
        "test_accuracy": accuracy,
        "examples_per_second": speed,
        "train_seconds": train_seconds,
    }


def test_recommendation_is_the_fastest_within_tolerance_of_the_best_accuracy():
    rows = [
        row("one_device", 0.970, 5000.0),
        row("mirrored", 0.975, 4000.0),
        row("parameter_server", 0.930, 9000.0),  # fastest, but too inaccurate
        row("multi_worker_mirrored", None, None, status="failed"),
    ]
    chosen = recommend(rows, tolerance=0.01)

    assert chosen is not None
    assert chosen["strategy"] == "one_device"
    assert "5000 examples/s" in chosen["reason"]
    assert "within 0.01 of the best (0.9750)" in chosen["reason"]
    assert "too inaccurate to count: parameter_server" in chosen["reason"]


def test_a_wider_tolerance_lets_the_faster_less_accurate_strategy_win():
    rows = [row("one_device", 0.970, 5000.0), row("parameter_server", 0.930, 9000.0)]
    assert recommend(rows, tolerance=0.05)["strategy"] == "parameter_server"  # type: ignore[index]
    assert recommend(rows, tolerance=0.0)["strategy"] == "one_device"  # type: ignore[index]


def test_equal_throughput_goes_to_the_shorter_training():
    rows = [
        row("mirrored", 0.97, 5000.0, train_seconds=12.0),
        row("one_device", 0.97, 5000.0, train_seconds=9.0),
    ]
    assert recommend(rows, tolerance=0.01)["strategy"] == "one_device"  # type: ignore[index]


def test_no_recommendation_when_nothing_succeeded():
    rows = [row("tpu", None, None, status="failed"), row("mirrored", None, None, status="failed")]
    assert recommend(rows, tolerance=0.01) is None
    assert recommend([], tolerance=0.01) is None


def test_markdown_lists_every_strategy_failures_and_the_rule():
    rows = [
        {**row("one_device", 0.97, 5000.0), "label": "one_device", "seconds_to_threshold": None},
        {**row("tpu", None, None, status="failed"), "label": "tpu", "error": "no TPU\ntrace"},
    ]
    recommendation = recommend(rows, 0.01)
    text = comparison_markdown(
        {
            "pipeline": "digits",
            "epochs": 2,
            "seed": 42,
            "threshold": 0.9,
            "tolerance": 0.01,
            "rule": RULE.format(tolerance="0.01"),
            "strategies": rows,
            "not_run": {"auto": "an alias"},
            "recommendation": recommendation,
        }
    )

    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 3  # header + one line per strategy
    assert "| one_device | succeeded | 5000.0 |" in text
    assert "not reached" in table[1]  # succeeded without reaching the threshold
    assert "- **tpu**: no TPU" in text and "trace" not in text
    assert "- **auto**: an alias" in text
    assert "**one_device**: one_device trained at 5000 examples/s" in text
    assert "at most 0.01 below the best" in text
