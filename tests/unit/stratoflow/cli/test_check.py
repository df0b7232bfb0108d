"""`stratoflow check`: the first task's checks of a pipeline, without Airflow, as CI runs them.

In-process (`main.main`), so TensorFlow is imported once for the module; the broken pipelines
are the ones of `tests/unit/stratoflow/training/test_own_code_check.py`, written into temporary
folders.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from stratoflow.cli import main
from stratoflow.config import discovery
from tests.unit.stratoflow.training.test_own_code_check import GOOD_MODEL, write_pipeline


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
    # Passes, with a note: its model reaches past stratoflow.api (written before the API).
    write_pipeline(
        team,
        "internal",
        {"model.py": "from stratoflow.config.features import Features\n" + GOOD_MODEL},
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
    assert printed.count("  ok    ") == 3 + 3 + 4 + 4
    assert printed.count("note: ") == 1
    assert (
        "        note: imports stratoflow past stratoflow.api (works now; only stratoflow.api is "
        "kept stable): model.py:1: stratoflow.config.features\n"
    ) in printed
    assert printed.splitlines()[-1] == (
        "checked 5 pipelines: 2 passed, 3 failed: gate, raising, shape"
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


# --- the docs' contract of a pipeline's own dataset --------------------------------------------

OWN_DATASET_SPEC = """\
description: a pipeline with a TFDS builder of its own
task: classification
dataset: {{name: {name}, version: 1.0.0, builder: "data:{cls}"}}
model: {{builder: mlp, hyperparameters: {{hidden_units: [4]}}}}
training: {{epochs: 1, batch_size: 2}}
evaluation: {{metric: test_accuracy, min: 0.1}}
registered_model: own-{name}
"""

OWN_BUILDER = """\
import numpy as np
import tensorflow_datasets as tfds

SPLITS = ("train", "validation", "test")


class {cls}(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {{"inputs": {inputs}, "label": tfds.features.ClassLabel(names=["a", "b"])}}
            ),
            supervised_keys={keys},
        )

    def _split_generators(self, dl_manager):
        return {{split: self._generate_examples(split) for split in SPLITS}}

    def _generate_examples(self, split):
        for index in range(4):
            yield f"{{split}}-{{index}}", {{"inputs": {value}, "label": index % 2}}
"""

TABULAR_INPUTS = (
    'tfds.features.FeaturesDict({"size": tfds.features.Tensor(shape=(), dtype=np.float32), '
    '"colour": tfds.features.ClassLabel(names=["red", "blue"])})'
)


def _own_dataset(root: Path, pipeline: str, cls: str, name: str, **builder: str) -> Path:
    values = {
        "inputs": TABULAR_INPUTS,
        "keys": '("inputs", "label")',
        "value": '{"size": np.float32(index), "colour": index % 2}',
        **builder,
    }
    folder = root / pipeline
    folder.mkdir(parents=True)
    (folder / "pipeline.yaml").write_text(OWN_DATASET_SPEC.format(name=name, cls=cls))
    (folder / "data.py").write_text(OWN_BUILDER.format(cls=cls, **values))
    return folder / "pipeline.yaml"


def test_check_holds_the_readmes_contract_of_a_pipelines_own_dataset(
    tf_runtime, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/reference/pipeline-code.md, "A TFDS builder of your own" and "An image folder": what
    each accepts and refuses."""
    from PIL import Image

    root = tmp_path / "own"
    _own_dataset(root, "tabular", "ReadmeTabular", "readme_tabular")
    renamed = _own_dataset(root, "renamed", "ReadmeRenamed", "renamed_data")
    no_keys = _own_dataset(root, "nokeys", "ReadmeNoKeys", "readme_no_keys", keys="None")
    column = _own_dataset(
        root,
        "column",
        "ReadmeColumn",
        "readme_column",
        inputs=TABULAR_INPUTS.replace("shape=()", "shape=(2,)"),
        value='{"size": np.zeros(2, np.float32), "colour": 0}',
    )
    free_shape = _own_dataset(
        root,
        "freeshape",
        "ReadmeFreeShape",
        "readme_free_shape",
        inputs="tfds.features.Image(shape=(None, None, 1))",
        value="np.zeros((4, 4, 1), np.uint8)",
    )
    # An image folder relative to the pipeline folder, its split folders named otherwise.
    images = write_pipeline(
        root,
        "folders",
        dataset=", image_folder: pictures, image_shape: [6, 6, 1], "
        "splits: {train: fit, validation: check, test: holdout}",
    )
    for split in ("fit", "check", "holdout"):
        for label, name in enumerate(("dark", "light")):
            (images / "pictures" / split / name).mkdir(parents=True)
            for index in range(3):
                pixels = [[80 * label + index] * 9] * 9  # any size: resized to image_shape
                Image.frombytes("L", (9, 9), bytes(sum(pixels, []))).save(
                    images / "pictures" / split / name / f"{index}.PNG"
                )

    assert main.main(["check", str(root)]) == 1

    printed = capsys.readouterr().out
    fail_lines = sorted(line for line in printed.splitlines() if line.startswith("  FAIL"))
    assert fail_lines == sorted(
        [
            f"  FAIL  dataset: {column}: dataset readme_column:1.0.0: column 'size' of "
            "'inputs' is Tensor with shape (2,); a tabular column must be a scalar number or a "
            "ClassLabel",
            f"  FAIL  dataset: {free_shape}: dataset readme_free_shape:1.0.0: input 'inputs' "
            "has shape (None, None, 1); stratoflow needs images of a fixed shape (height, "
            "width, channels) or a FeaturesDict of tabular columns",
            f"  FAIL  dataset: {no_keys}: dataset readme_no_keys:1.0.0 has no (input, label) "
            "supervised keys",
            f"  FAIL  dataset: {renamed}: dataset.name 'renamed_data' differs from the name of "
            "dataset.builder 'data:ReadmeRenamed', 'readme_renamed' (TFDS names a builder after "
            "its class)",
        ]
    ), printed
    assert "train 4, validation 4, test 4; 2 tabular columns -> 2 classes" in printed
    assert (
        f"dataset: stratoflow_digits 1.0.0 prepared in {images / 'pictures'}: train 6, "
        "validation 6, test 6; images 6x6x1 -> 2 classes" in printed
    )
    assert printed.splitlines()[-1] == (
        "checked 6 pipelines: 2 passed, 4 failed: column, freeshape, nokeys, renamed"
    )
