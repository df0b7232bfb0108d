"""The strategy benchmark's rules: which strategies a host can run, what each run measured, and
which strategy to recommend.

Pure functions on small dicts (no TensorFlow, no MLflow), so the rules are tested on their own;
`stratoflow.tasks.strategy_benchmark` feeds them from the host, the training runs and MLflow.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stratoflow.config.spec import PipelineSpec
from stratoflow.config.strategies import STRATEGIES

# The shapes benchmarked: two of everything fits a 2-core host and shows whether splitting pays.
REPLICAS = 2
WORKERS = 2
PARAMETER_SERVERS = 1

RULE = (
    "Recommended: of the strategies that succeeded and whose final test accuracy is at most "
    "{tolerance} below the best one's, the one with the highest median throughput "
    "(examples/s over the epochs after the first)."
)

TABLE_COLUMNS = (
    "strategy",
    "status",
    "examples_per_second",
    "seconds_to_first_step",
    "train_seconds",
    "seconds_to_threshold",
    "final_val_accuracy",
    "test_accuracy",
)


@dataclass(frozen=True)
class HostDevices:
    """The accelerators this host has (a CPU-only host has none)."""

    gpus: int = 0
    tpus: int = 0


def plan_strategies(
    spec: PipelineSpec, requested: Sequence[str], host: HostDevices
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Which strategies to benchmark, each as the training overrides of its run.

    With no `requested` strategies: every strategy of `stratoflow.config.strategies.STRATEGIES`
    this host can run with `spec`'s model and batch size, except `auto` (an alias of one_device or
    mirrored here, so it would measure one of them twice). With `requested`: exactly those, in
    that order; one the host cannot run carries the reason in `unavailable`, and its training
    fails at once with it.

    Args:
        spec: the pipeline (its model decides central_storage, its batch size the splits).
        requested: strategy names (already validated against STRATEGIES), or empty.
        host: the host's accelerators.

    Returns:
        The planned entries (`strategy`, `label`, `overrides`, `unavailable`) and, for an empty
        request, the strategies left out with the reason for each.

    Raises:
        ValueError: a requested name is not in STRATEGIES (the message lists the allowed ones).
    """
    unknown = [name for name in requested if name not in STRATEGIES]
    if unknown:
        raise ValueError(
            f"strategies: {unknown[0]!r} is not allowed; allowed: {', '.join(STRATEGIES)}"
        )
    reasons = {name: cannot_run_reason(name, spec, host) for name in STRATEGIES}
    if requested:
        names = list(dict.fromkeys(requested))
        return [_entry(name, host, reasons[name]) for name in names], {}
    skipped = {name: reason for name, reason in reasons.items() if reason}
    for name, described in STRATEGIES.items():
        if described.alias_of:
            several_gpus, otherwise = described.alias_of
            skipped[name] = (
                f"an alias of {several_gpus if host.gpus > 1 else otherwise} on this host, "
                "which is benchmarked under its own name"
            )
    planned = [_entry(name, host, None) for name in STRATEGIES if name not in skipped]
    return planned, skipped


def cannot_run_reason(name: str, spec: PipelineSpec, host: HostDevices) -> str | None:
    """Why strategy `name` cannot train `spec` on this host in the benchmark's shape, or None."""
    described = STRATEGIES[name]
    batch = spec.training.batch_size
    if described.needs_tpu and not host.tpus:
        return "no TPU is attached to this host"
    if described.refuses_random_layers and model_has_random_layers(spec):
        return (
            f"model {spec.model.builder!r} has Dropout (model.hyperparameters.dropout), which "
            "CentralStorage cannot train"
        )
    if described.uses_replicas and not host.gpus and batch % REPLICAS:
        return f"batch_size {batch} does not split over {REPLICAS} replicas"
    if described.batch_divides_by == "workers" and batch % WORKERS:
        return f"batch_size {batch} does not split over {WORKERS} workers"
    return None


def model_has_random_layers(spec: PipelineSpec) -> bool:
    """Whether `spec`'s model has Dropout: its `dropout` hyperparameter (or default) is non-zero."""
    from stratoflow.training.models import has_random_layers

    return has_random_layers(spec.model.builder, spec.model.hyperparameters)


def _entry(name: str, host: HostDevices, unavailable: str | None) -> dict[str, Any]:
    overrides = {
        "strategy": name,
        "replicas": REPLICAS,
        "workers": WORKERS,
        "ps": PARAMETER_SERVERS,
        "loop": "custom",  # the one loop every strategy runs
        "cluster": "",  # local processes: the benchmark measures this host
    }
    return {
        "strategy": name,
        "label": _label(name, host),
        "overrides": overrides,
        "unavailable": unavailable,
    }


def _label(name: str, host: HostDevices) -> str:
    described = STRATEGIES[name]
    if described.uses_ps:
        return f"{name} ({WORKERS} workers + {PARAMETER_SERVERS} ps)"
    if described.uses_workers:
        return f"{name} ({WORKERS} workers)"
    if described.uses_replicas:
        return f"{name} ({f'{host.gpus} GPUs' if host.gpus else f'{REPLICAS} logical CPUs'})"
    return name


def steady_throughput(examples_per_second: Sequence[float]) -> float | None:
    """The median examples/s over the epochs after the first (tracing and warm-up happen in the
    first); the first epoch's if it is the only one, None if there is none."""
    values = list(examples_per_second)
    if not values:
        return None
    return float(statistics.median(values[1:] if len(values) > 1 else values))


def threshold_reached(
    history: Sequence[Mapping[str, float]], threshold: float
) -> dict[str, float] | None:
    """The first epoch whose val_accuracy reached `threshold`, and the training seconds (sum of
    epoch times) up to its end; None if no epoch did."""
    seconds = 0.0
    for entry in history:
        seconds += float(entry["seconds"])
        if float(entry["val_accuracy"]) >= threshold:
            return {"epoch": int(entry["epoch"]), "seconds": seconds}
    return None


def recommend(rows: Sequence[Mapping[str, Any]], tolerance: float) -> dict[str, str] | None:
    """Apply `RULE` to the benchmark's rows.

    Args:
        rows: one per strategy, with `strategy`, `status` ("succeeded" or "failed"),
            `test_accuracy` and `examples_per_second`.
        tolerance: how far below the best test accuracy a strategy may be and still count.

    Returns:
        `{"strategy": name, "reason": sentence}`, or None when no strategy succeeded.
    """
    succeeded = [
        row
        for row in rows
        if row["status"] == "succeeded"
        and row.get("test_accuracy") is not None
        and row.get("examples_per_second") is not None
    ]
    if not succeeded:
        return None
    best_accuracy = max(float(row["test_accuracy"]) for row in succeeded)
    # A little slack for float noise in accuracies that are equal in truth.
    eligible = [
        row for row in succeeded if float(row["test_accuracy"]) >= best_accuracy - tolerance - 1e-9
    ]
    chosen = max(
        eligible,
        key=lambda row: (float(row["examples_per_second"]), -float(row.get("train_seconds") or 0)),
    )
    left_out = sorted(row["strategy"] for row in succeeded if row not in eligible)
    reason = (
        f"{chosen['strategy']} trained at {float(chosen['examples_per_second']):.0f} examples/s, "
        f"the fastest of {len(eligible)} strateg{'y' if len(eligible) == 1 else 'ies'} whose "
        f"test accuracy is within {tolerance:g} of the best ({best_accuracy:.4f}); its test "
        f"accuracy is {float(chosen['test_accuracy']):.4f}"
    )
    if left_out:
        reason += f"; too inaccurate to count: {', '.join(left_out)}"
    return {"strategy": str(chosen["strategy"]), "reason": reason}


def comparison_markdown(comparison: Mapping[str, Any]) -> str:
    """The comparison as a Markdown document: the table, the failures, the recommendation."""
    rows = comparison["strategies"]
    header = "| " + " | ".join(TABLE_COLUMNS) + " |"
    lines = [
        f"# Strategy benchmark: {comparison['pipeline']}",
        "",
        f"{comparison['epochs']} epochs per strategy, seed {comparison['seed']}, threshold "
        f"val_accuracy >= {comparison['threshold']} (the pipeline's gate). Throughput is the "
        "median examples/s over the epochs after the first.",
        "",
        header,
        "|" + "---|" * len(TABLE_COLUMNS),
        *("| " + " | ".join(cells(row)) + " |" for row in rows),
        "",
    ]
    failures = [row for row in rows if row["status"] != "succeeded"]
    if failures:
        lines += ["## Failed", ""]
        lines += [f"- **{row['strategy']}**: {first_line(row.get('error'))}" for row in failures]
        lines.append("")
    if comparison.get("not_run"):
        lines += ["## Not run on this host", ""]
        lines += [f"- **{name}**: {reason}" for name, reason in comparison["not_run"].items()]
        lines.append("")
    recommendation = comparison.get("recommendation")
    lines += [
        "## Recommendation",
        "",
        f"**{recommendation['strategy']}**: {recommendation['reason']}."
        if recommendation
        else "None: no strategy succeeded.",
        "",
        comparison["rule"],
        "",
    ]
    return "\n".join(lines)


def cells(row: Mapping[str, Any]) -> list[str]:
    """The table cells of one row, in `TABLE_COLUMNS` order ("not reached", "-" where none)."""
    values = []
    for column in TABLE_COLUMNS:
        value = row.get(column)
        if column == "strategy":
            value = row.get("label") or row["strategy"]
        if column == "seconds_to_threshold" and value is None and row["status"] == "succeeded":
            values.append("not reached")
        elif value is None:
            values.append("-")
        elif isinstance(value, float):
            values.append(f"{value:.4f}" if "accuracy" in column else f"{value:.1f}")
        else:
            values.append(str(value))
    return values


def first_line(error: Any, limit: int = 300) -> str:
    """The first line of an error message, shortened to `limit` characters."""
    text = str(error or "unknown error").strip().splitlines()[0] if error else "unknown error"
    return text if len(text) <= limit else text[: limit - 1] + "…"
