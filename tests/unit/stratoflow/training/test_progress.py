"""The per-epoch progress line written to the training task's log."""

from __future__ import annotations

import logging

import pytest

from stratoflow.training.progress import EpochProgress, format_epoch_line
from stratoflow.training.trainer import EpochMetrics


def metrics(epoch: int, seconds: float = 2.0) -> EpochMetrics:
    return EpochMetrics(
        epoch=epoch,
        loss=0.12345,
        metric=0.96123,
        val_loss=0.2,
        val_metric=0.95,
        examples_per_second=4210.4,
        seconds=seconds,
    )


def test_the_line_reads_like_a_sentence():
    assert format_epoch_line(metrics(3), 10, 35.4) == (
        "epoch 3/10: loss 0.1235, accuracy 0.9612, val_loss 0.2000, val_accuracy 0.9500, "
        "4,210 examples/s, ETA 0:00:35"
    )


def test_eta_is_the_mean_epoch_wall_time_times_the_epochs_left(caplog: pytest.LogCaptureFixture):
    now = iter([100.0, 105.0, 108.0])
    progress = EpochProgress(epochs=5, clock=lambda: next(now))
    with caplog.at_level(logging.INFO, logger="stratoflow.training.progress"):
        progress(metrics(1, seconds=4.0))  # first epoch: its own training time, 4 s
        progress(metrics(2))  # 5 s since epoch 1 ended
        progress(metrics(3))  # 3 s
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3
    assert lines[0].startswith("epoch 1/5:") and lines[0].endswith("ETA 0:00:16")  # 4 s x 4
    assert lines[1].endswith("ETA 0:00:14")  # 4.5 s x 3 = 13.5
    assert lines[2].endswith("ETA 0:00:08")  # 4 s x 2
