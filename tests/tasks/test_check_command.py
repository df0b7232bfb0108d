"""`stratoflow check`: the first task's checks of a pipeline, without Airflow, as CI runs them.

In-process (`main.main`), so TensorFlow is imported once for the module; the broken pipelines
are the ones of `tests/tasks/test_own_code.py`, written into temporary folders.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from stratoflow.cli import main
from stratoflow.config import discovery
from tests.tasks.test_own_code import GOOD_MODEL, write_pipeline


def test_check_passes_a_bundled_pipeline_with_a_line_per_check(
    tf_runtime, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main(["check", "digits"]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"pipeline digits ({discovery.BUNDLED_DIR / 'digits' / 'pipeline.yaml'})"
    checks = [line.split(":")[0].split(maxsplit=1) for line in lines[1:5]]
    assert checks == [["ok", "spec"], ["ok", "run defaults"], ["ok", "dataset"], ["ok", "own code"]]
    assert "retrain_digits, benchmark_strategies_digits, refresh_stratoflow_digits" in lines[1]
    assert "train 1439, validation 179, test 179; images 8x8x1 -> 10 classes" in lines[3]
    assert lines[5:] == ["checked 1 pipeline: all passed"]


def test_check_fails_broken_pipelines_naming_the_file_and_the_field(
    tf_runtime, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = tmp_path / "team"  # a folder of pipeline folders
    spec_error = write_pipeline(team, "gate", metric="test_mae", bound="max: 5.0")
    raising = write_pipeline(
        team,
        "raising",
        {"model.py": "def build(features, target, width=8):\n    raise RuntimeError('boom')\n"},
    )
    # One pipeline folder on its own: the model gives 3 outputs for digits' 10 classes.
    shape = write_pipeline(
        tmp_path / "elsewhere",
        "shape",
        {"model.py": GOOD_MODEL.replace("Dense(target.num_outputs)", "Dense(3)")},
    )
    path_before = os.environ.get(discovery.PIPELINES_PATH_ENV)

    assert main.main(["check", str(team), str(shape), "digits"]) == 1

    printed = capsys.readouterr().out
    fail_lines = [line for line in printed.splitlines() if line.startswith("  FAIL")]
    assert fail_lines == [
        f"  FAIL  spec: {spec_error / 'pipeline.yaml'}: evaluation.metric 'test_mae' is not a "
        "metric of task 'classification'; allowed: test_accuracy, test_loss",
        f"  FAIL  own code: {raising / 'pipeline.yaml'}: model.builder 'model:build' raised "
        "RuntimeError: boom",
        f"  FAIL  own code: {shape / 'pipeline.yaml'}: model.builder 'model:build': the model "
        "outputs shape (2, 3) for 2 examples; the classification target needs (2, 10): one "
        "logit per class",
    ], printed
    # The checks after a failed one are skipped; the good pipeline passes beside them.
    assert printed.count("  skip  ") == 3
    assert printed.count("  ok    ") == 3 + 3 + 4
    assert printed.splitlines()[-1] == (
        "checked 4 pipelines: 1 passed, 3 failed: gate, raising, shape"
    )
    assert os.environ.get(discovery.PIPELINES_PATH_ENV) == path_before


def test_check_refuses_what_is_neither_a_pipeline_nor_a_folder_of_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    for target in ("nope", str(tmp_path / "empty")):
        with pytest.raises(SystemExit) as exit_info:
            main.main(["check", target])
        assert exit_info.value.code == 2
        assert f"{target!r} is neither a pipeline nor a folder holding pipelines" in (
            capsys.readouterr().err
        )


def test_list_exits_1_naming_the_file_and_field_of_a_pipeline_that_does_not_load(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    spec = (discovery.BUNDLED_DIR / "digits" / "pipeline.yaml").read_text()
    (broken / "pipeline.yaml").write_text(spec.replace("builder: mlp", "builder: resnet"))
    (tmp_path / "fine").mkdir()
    (tmp_path / "fine" / "pipeline.yaml").write_text(spec)
    (tmp_path / "fine" / "model.py").write_text(textwrap.dedent(GOOD_MODEL))
    monkeypatch.setenv(discovery.PIPELINES_PATH_ENV, str(tmp_path))

    assert main.main(["list"]) == 1

    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:]]
    assert listed == ["diabetes", "digits", "fine", "mnist", "penguins"]  # the rest still listed
    assert (
        f"not loaded: pipeline 'broken': {broken / 'pipeline.yaml'}: model.builder 'resnet' is "
        "not a known model builder" in caplog.text
    )
