"""Figures logged with a run and drawn by `stratoflow compare --plot`: PNGs made with matplotlib.

matplotlib is imported inside the functions with the Agg backend (no display on an Airflow
worker), so importing this module is cheap. The drawing functions return a matplotlib `Figure`;
`save_png` writes and closes it (`stratoflow.tracking.mlflow_runs.log_figure` logs and closes it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

History = Sequence[Mapping[str, float]]

# Figure size in inches at DPI: about 1100 x 450 pixels, readable in the MLflow artifact viewer.
CURVES_SIZE = (11.0, 4.5)
DPI = 100


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display: Airflow workers and CI are headless
    import matplotlib.pyplot as plt

    return plt


def training_curves(history: History, title: str = "") -> Any:
    """Loss and accuracy per epoch, train and validation, side by side.

    Args:
        history: one entry per epoch with `epoch`, `loss`, `accuracy`, `val_loss`,
            `val_accuracy` (a training result's history, or the run's metric history).
        title: the figure's title, e.g. the run name.
    """
    plt = _pyplot()
    figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=CURVES_SIZE, dpi=DPI)
    epochs = [int(entry["epoch"]) for entry in history]
    metric = epoch_metric_of(history)
    for axes, key in ((loss_axes, "loss"), (accuracy_axes, metric)):
        axes.plot(epochs, [entry[key] for entry in history], "o-", label=f"train {key}")
        axes.plot(epochs, [entry[f"val_{key}"] for entry in history], "s--", label=f"val_{key}")
        axes.set_xlabel("epoch")
        axes.set_ylabel(key)
        axes.set_title(key)
        axes.grid(alpha=0.3)
        axes.legend()
        _integer_ticks(axes)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


def confusion_matrix(
    matrix: Sequence[Sequence[int]], class_names: Sequence[str], title: str = ""
) -> Any:
    """The test split's confusion matrix: true class by row, predicted class by column, counts.

    Args:
        matrix: counts, `matrix[true][predicted]`.
        class_names: the label of each class, in index order.
        title: a first title line, e.g. the pipeline and strategy of the run.
    """
    import numpy as np

    plt = _pyplot()
    counts = np.asarray(matrix)
    size = max(4.0, 0.55 * len(counts) + 2.0)
    figure, axes = plt.subplots(figsize=(size + 1.0, size), dpi=DPI)
    image = axes.imshow(counts, cmap="Blues")
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    ticks = range(len(counts))
    axes.set_xticks(ticks, labels=class_names, rotation=45 if len(counts) > 12 else 0)
    axes.set_yticks(ticks, labels=class_names)
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    subtitle = f"confusion matrix ({int(counts.sum())} test examples)"
    axes.set_title(f"{title}\n{subtitle}" if title else subtitle)
    threshold = counts.max() / 2 if counts.size else 0
    for (row, column), count in np.ndenumerate(counts):
        axes.text(
            column,
            row,
            str(count),
            ha="center",
            va="center",
            fontsize=8,
            color="white" if count > threshold else "black",
        )
    figure.tight_layout()
    return figure


def validation_curves(runs: Sequence[tuple[str, History]]) -> Any:
    """Several runs' val_loss and val_accuracy per epoch overlaid: one line (colour) per run.

    Args:
        runs: (label, history) per run, in legend order; run i is drawn in matplotlib's colour
            `C<i>` on both panels.
    """
    plt = _pyplot()
    figure, (loss_axes, accuracy_axes) = plt.subplots(
        1, 2, figsize=(CURVES_SIZE[0], CURVES_SIZE[1] + 0.35 * len(runs)), dpi=DPI
    )
    metric = "val_" + epoch_metric_of(runs[0][1] if runs else [])
    for index, (label, history) in enumerate(runs):
        epochs = [int(entry["epoch"]) for entry in history]
        for axes, key in ((loss_axes, "val_loss"), (accuracy_axes, metric)):
            axes.plot(
                epochs, [entry[key] for entry in history], "o-", color=f"C{index}", label=label
            )
    for axes, key in ((loss_axes, "val_loss"), (accuracy_axes, metric)):
        axes.set_xlabel("epoch")
        axes.set_ylabel(key)
        axes.set_title(key)
        axes.grid(alpha=0.3)
        _integer_ticks(axes)
    handles, labels = loss_axes.get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=1, fontsize=9, frameon=False)
    figure.tight_layout(rect=(0, 0.02 + 0.05 * len(runs), 1, 1))
    return figure


def save_png(figure: Any, path: str | Path) -> Path:
    """Write `figure` as a PNG at `path` (folders created) and close it."""
    plt = _pyplot()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        figure.savefig(target, format="png")
    finally:
        plt.close(figure)
    return target


def epoch_metric_of(history: History) -> str:
    """The epoch metric a history holds besides the loss: `accuracy`, or `mae` (regression)."""
    for entry in history:
        for name in ("accuracy", "mae"):
            if name in entry or f"val_{name}" in entry:
                return name
    return "accuracy"


def residuals(predictions: Sequence[float], targets: Sequence[float], title: str = "") -> Any:
    """A regression model's residuals (target - prediction) against its predictions."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=CURVES_SIZE, dpi=DPI)
    errors = [float(t) - float(p) for p, t in zip(predictions, targets, strict=True)]
    axes.scatter(list(predictions), errors, s=12, alpha=0.7)
    axes.axhline(0.0, color="black", linewidth=1)
    axes.set_xlabel("prediction")
    axes.set_ylabel("residual (target - prediction)")
    axes.set_title(title or "test residuals")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def _integer_ticks(axes: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
