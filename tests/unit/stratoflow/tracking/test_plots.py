"""The figures a run carries and `stratoflow compare --plot` draws: real matplotlib PNGs."""

from __future__ import annotations

import pytest

from stratoflow.tracking import plots
from tests.support.images import PNG_SIGNATURE, colour_pixels


def history(epochs: int, offset: float = 0.0) -> list[dict[str, float]]:
    return [
        {
            "epoch": epoch,
            "loss": 1.0 / epoch + offset,
            "accuracy": 0.5 + 0.05 * epoch,
            "val_loss": 1.2 / epoch + offset,
            "val_accuracy": 0.45 + 0.05 * epoch - offset,
        }
        for epoch in range(1, epochs + 1)
    ]


def test_training_curves_draw_train_and_validation_per_epoch(tmp_path):
    figure = plots.training_curves(history(4), title="digits: mirrored")
    loss_axes, accuracy_axes = figure.axes
    assert [line.get_label() for line in loss_axes.lines] == ["train loss", "val_loss"]
    assert [line.get_label() for line in accuracy_axes.lines] == ["train accuracy", "val_accuracy"]
    assert list(loss_axes.lines[1].get_xdata()) == [1, 2, 3, 4]
    assert list(loss_axes.lines[1].get_ydata()) == pytest.approx([1.2, 0.6, 0.4, 0.3])
    path = plots.save_png(figure, tmp_path / "plots" / "curves.png")
    assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_confusion_matrix_writes_every_count_in_its_cell():
    matrix = [[5, 1, 0], [0, 7, 2], [1, 0, 9]]
    figure = plots.confusion_matrix(matrix, ["zero", "one", "two"])
    axes = figure.axes[0]
    # (x, y) = (predicted column, true row)
    cells = {(text.get_position(), text.get_text()) for text in axes.texts}
    assert ((2, 1), "2") in cells and ((0, 2), "1") in cells and len(cells) == 9
    assert [label.get_text() for label in axes.get_yticklabels()] == ["zero", "one", "two"]
    assert "25 test examples" in axes.get_title()


def test_validation_curves_draw_one_coloured_line_per_run(tmp_path):
    runs = [("run a (one_device)", history(3)), ("run b (mirrored)", history(2, 0.1))]
    figure = plots.validation_curves(runs)
    for axes in figure.axes:
        assert [line.get_label() for line in axes.lines] == [
            "run a (one_device)",
            "run b (mirrored)",
        ]
    path = plots.save_png(figure, tmp_path / "compare.png")
    assert colour_pixels(path, "C0") > 100 and colour_pixels(path, "C1") > 100
    assert colour_pixels(path, "C2") == 0  # no third run, no third colour
