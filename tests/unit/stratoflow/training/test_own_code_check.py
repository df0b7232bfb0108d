"""A pipeline's own code and data, checked by the run's first task before any training.

Each pipeline here lives in a temporary folder on `STRATOFLOW_PIPELINES_PATH`, as a user's would.
The first task (`stratoflow.tasks.prepare.prepare`, the body of `prepare_dataset`) prepares the
dataset and checks the pipeline's code in a child process (`stratoflow.training.own_code_check`).
Every
mistake is a `SpecError` naming the pipeline file and the field: the mistakes are tried on the
child's own work in-process (`prepare_and_check_here`); through the first task, a refusal keeps
its message, is a `SpecError` (the DAG's refusal rule fails it without retry,
`stratoflow/dags/refusals.py`) and comes before any MLflow run; a child that dies fails the task
with its last lines; and the child runs the pipeline's builder and preprocessing without the
deployment's
secrets. Then the bundled tabular pipelines train under the single-process strategies,
in-process.
"""

from __future__ import annotations

import dataclasses
import shutil
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from stratoflow.config import locations, names
from stratoflow.config.parsing import SpecError
from stratoflow.config.spec import load_spec, parse_spec
from stratoflow.tasks.run_context import AirflowRun
from tests.support.images import write_bar_images

DIGITS_SPEC = """\
description: a user's pipeline on the digits
task: {task}
dataset: {{name: stratoflow_digits, version: 1.0.0{dataset}}}
model: {{builder: "{builder}", hyperparameters: {hyperparameters}}}
training: {{epochs: 1, batch_size: 32}}
evaluation: {{metric: {metric}, {bound}, max_regression: 0.0}}
registered_model: user-{name}
"""

GOOD_MODEL = """
import keras

def build(features, target, width=8):
    inputs = keras.Input(shape=features.shape)
    x = keras.layers.Dense(width, activation="relu")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(target.num_outputs)(x))
"""


def write_pipeline(root: Path, name: str, files: dict[str, str] | None = None, **spec: Any) -> Path:
    values = {
        "task": "classification",
        "dataset": "",
        "builder": "model:build",
        "hyperparameters": "{width: 8}",
        "metric": "test_accuracy",
        "bound": "min: 0.5",
        "name": name,
        **spec,
    }
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "pipeline.yaml").write_text(DIGITS_SPEC.format(**values))
    for file, text in {"model.py": GOOD_MODEL, **(files or {})}.items():
        (folder / file).write_text(textwrap.dedent(text))
    return folder


@pytest.fixture
def pipelines_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STRATOFLOW_PIPELINES_PATH", str(tmp_path))
    return tmp_path


def refused(pipeline: str) -> str:
    """The first task's refusal message for `pipeline`; no MLflow run may exist afterwards."""
    from stratoflow.tasks import prepare

    run = AirflowRun(f"retrain_{pipeline}", f"manual__{uuid.uuid4().hex[:12]}")
    with pytest.raises(SpecError) as error:
        prepare.prepare(pipeline, {}, run)
    assert_no_mlflow_run(pipeline)
    return str(error.value)


def assert_no_mlflow_run(pipeline: str) -> None:
    from stratoflow.tracking import mlflow_runs

    client = mlflow_runs.client()
    experiment = client.get_experiment_by_name(names.experiment_name(pipeline))
    assert experiment is None or not client.search_runs([experiment.experiment_id])


def refused_here(pipeline: str) -> str:
    """The refusal of what the first task's child does, run in this process."""
    from stratoflow.config.run_plan import resolve_plan
    from stratoflow.training.own_code_check import prepare_and_check_here

    with pytest.raises(SpecError) as error:
        prepare_and_check_here(resolve_plan(pipeline, {}).spec)
    return str(error.value)


CASES = {
    "unresolved module": (
        {"builder": "modle:build"},
        {},
        "model.builder: module 'modle' is found neither in the pipeline folder",
    ),
    "unresolved name": (
        {"builder": "model:make"},
        {},
        "model.builder: 'model:make' does not resolve: module 'model'",
    ),
    "unknown hyperparameter": (
        {"hyperparameters": "{widht: 8}"},
        {},
        "model.hyperparameters: 'widht' is not a hyperparameter of 'model:build'; allowed: width",
    ),
    "builder raises": (
        {},
        {"model.py": "def build(features, target, width=8):\n    raise RuntimeError('boom')\n"},
        "model.builder 'model:build' raised RuntimeError: boom",
    ),
    "builder returns no keras model": (
        {},
        {"model.py": "def build(features, target, width=8):\n    return 'a model'\n"},
        "model.builder 'model:build' returned str, not a keras.Model",
    ),
    "model cannot take the features": (
        {},
        {
            "model.py": GOOD_MODEL.replace(
                "keras.Input(shape=features.shape)", "keras.Input(shape=(28, 28, 1))"
            )
        },
        "model.builder 'model:build': the model cannot take the dataset's features (image: "
        "float32[2, 8, 8, 1])",
    ),
    "labels do not fit regression": (
        {"task": "regression", "metric": "test_mae", "bound": "max: 5.0"},
        {},
        "task 'regression' needs float targets as labels, but the label 'label' of dataset "
        "stratoflow_digits:1.0.0 is a ClassLabel",
    ),
    "preprocessing fails": (
        {"dataset": ', preprocess: "prep:scale"'},
        {"prep.py": "def scale(image, label):\n    return image * 'x', label\n"},
        "dataset.preprocess 'prep:scale' failed on the training examples",
    ),
    "feature slice on images": (
        {"bound": "min: 0.5, slices: {features: [{feature: pixels, min: 0}]}"},
        {},
        "evaluation.slices.features[0]: feature slices need tabular data; this dataset is images",
    ),
    "unknown optimizer argument": (
        {},
        {},
        "optimizer: 'momentun' is not an argument of Keras optimizer 'sgd'; allowed:",
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_own_code_mistakes_are_refused_naming_file_and_field(
    pipelines_path: Path, tf_runtime, case: str
) -> None:
    spec_values, files, message = CASES[case]
    folder = write_pipeline(pipelines_path, "mine", files, **spec_values)
    if case == "unknown optimizer argument":
        spec = folder / "pipeline.yaml"
        spec.write_text(spec.read_text() + "optimizer: {name: sgd, momentun: 0.9}\n")
    error = refused_here("mine")
    assert error.startswith(f"{folder / 'pipeline.yaml'}: "), error
    assert message in error, error


@pytest.mark.integration
def test_the_first_task_refuses_from_its_child_before_any_mlflow_run(
    pipelines_path: Path,
) -> None:
    spec_values, files, message = CASES["builder raises"]
    folder = write_pipeline(pipelines_path, "mine", files, **spec_values)
    error = refused("mine")
    assert error.startswith(f"{folder / 'pipeline.yaml'}: "), error
    assert message in error, error


@pytest.mark.integration
def test_a_passed_check_is_not_repeated_and_an_edited_model_is_checked_again(
    pipelines_path: Path, tf_runtime, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A second run of unchanged code, data and configuration recalls the first run's check (no
    child: the model builder is not called again) and gets the same dataset and statistics; an
    edit of the model is checked again, and refused before any MLflow run of its own."""
    from stratoflow.data.datasets import prepare_dataset
    from stratoflow.data.statistics import STATISTICS_FILE
    from stratoflow.tasks import prepare

    calls = tmp_path_factory.mktemp("builder-calls") / "calls"
    header = "def build(features, target, width=8):\n"
    counting = GOOD_MODEL.replace(header, f"{header}    open({str(calls)!r}, 'a').write('x')\n")
    folder = write_pipeline(pipelines_path, "recalled", {"model.py": counting})
    spec = load_spec("recalled")
    prepare_dataset(spec.dataset, problem_type=spec.task)  # prepared before the runs, as usual

    runs = [AirflowRun("retrain_recalled", f"manual__{uuid.uuid4().hex[:12]}") for _ in range(2)]
    first, second = (prepare.prepare("recalled", {}, run) for run in runs)

    assert calls.read_text() == "x"  # the builder ran in the first run's check only
    assert second.dataset == first.dataset
    statistics = [
        (locations.run_dir(run.dag_id, run.run_id) / STATISTICS_FILE).read_text() for run in runs
    ]
    assert statistics[1] == statistics[0]

    (folder / "model.py").write_text(CASES["builder raises"][1]["model.py"])
    before = mlflow_run_count("recalled")
    with pytest.raises(SpecError, match="model.builder 'model:build' raised RuntimeError: boom"):
        prepare.prepare(
            "recalled", {}, AirflowRun("retrain_recalled", f"manual__{uuid.uuid4().hex}")
        )
    assert mlflow_run_count("recalled") == before


def mlflow_run_count(pipeline: str) -> int:
    from stratoflow.tracking import mlflow_runs

    client = mlflow_runs.client()
    experiment = client.get_experiment_by_name(names.experiment_name(pipeline))
    return 0 if experiment is None else len(client.search_runs([experiment.experiment_id]))


@pytest.mark.integration
def test_a_check_that_dies_fails_the_first_task_with_its_last_lines(pipelines_path: Path) -> None:
    from stratoflow.distributed.launcher import ChildProcessFailed
    from stratoflow.tasks import prepare

    dying = GOOD_MODEL + (
        "\nimport os, signal\n\n"
        "def build(features, target, width=8):\n"
        "    print('the builder goes down now', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    write_pipeline(pipelines_path, "mine", {"model.py": dying})
    run = AirflowRun("retrain_mine", f"manual__{uuid.uuid4().hex[:12]}")
    with pytest.raises(ChildProcessFailed) as failure:
        prepare.prepare("mine", {}, run)
    assert not isinstance(failure.value, SpecError)  # not a refusal: Airflow may retry it
    message = str(failure.value)
    assert "own-code check (pid " in message, message
    assert "was killed by SIGKILL" in message, message
    assert "the builder goes down now" in message, message
    assert_no_mlflow_run("mine")


@pytest.mark.integration
def test_the_first_task_runs_the_pipelines_code_without_the_deployments_secrets(
    pipelines_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch
) -> None:
    """The first task's child runs the pipeline's own TFDS builder and preprocessing (penguins'
    code, each calling a probe that writes down its process's environment) with a team's
    variable, and none of the task process's secrets (nor anything of MLflow's)."""
    import os

    from stratoflow.cli import main
    from stratoflow.tasks import prepare
    from tests.support.secret_sentinels import (
        MLFLOW_ACCOUNT,
        SECRET_VARIABLES,
        dumps,
        env_probe,
        leaked,
    )

    probes = tmp_path_factory.mktemp("environment-dumps")
    assert main.main(["new-pipeline", "mine", "--from", "penguins"]) == 0
    folder = pipelines_path / "mine"
    (folder / "env_probe.py").write_text(env_probe(probes))
    with (folder / "penguins_dataset.py").open("a") as builder:
        builder.write("\nfrom . import env_probe\n\nenv_probe.dump('dataset builder')\n")
    (folder / "probed.py").write_text(
        "from . import env_probe\n\n\n"
        "def shift(features, label):\n"
        "    env_probe.dump('preprocessing')\n"
        "    return features, label\n"
    )
    spec = folder / "pipeline.yaml"
    spec.write_text(
        spec.read_text().replace(
            '"penguins_dataset:StratoflowPenguins"',
            '"penguins_dataset:StratoflowPenguins"\n  preprocess: "probed:shift"',
        )
    )
    for name, value in {**SECRET_VARIABLES, **MLFLOW_ACCOUNT}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("STRATOFLOW_PIPELINE_ENV_TEAM_SETTING", "team-value")

    run = AirflowRun("retrain_mine", f"manual__{uuid.uuid4().hex[:12]}")
    prepared = prepare.prepare("mine", {}, run)

    assert prepared.dataset.preprocess == "probed:shift"
    seen = dumps(probes)
    assert {probe["where"] for probe in seen} == {"dataset builder", "preprocessing"}
    for probe in seen:
        assert probe["pid"] != os.getpid(), f"{probe['where']} ran in the task process"
        assert probe["argv"][0].endswith("own_code_check.py"), probe["argv"]
        environ = probe["environ"]
        assert leaked(environ) == [], f"{probe['where']} was handed {leaked(environ)}"
        assert environ["TEAM_SETTING"] == "team-value"


IMAGES_SPEC = """\
description: a user's pipeline on a folder of PNG images
task: classification
dataset: {{name: bars, image_folder: images, image_shape: [12, 12, 1]{splits}}}
model: {{builder: "model:build"}}
training: {{epochs: 1, batch_size: 4}}
evaluation: {{metric: test_accuracy, min: 0.5}}
registered_model: user-bars
"""
LAYOUT = "expected <folder>/<split>/<class>/<image> with .jpg, .jpeg or .png images"


def _empty_split(images: Path) -> None:
    shutil.rmtree(images / "test")
    (images / "test").mkdir()


def _empty_class_folders(images: Path) -> None:
    for image in (images / "test").glob("*/*.png"):
        image.rename(image.with_suffix(".bmp"))  # a format TFDS's ImageFolder does not read


def _no_class_folders(images: Path) -> None:
    for image in (images / "test").glob("*/*.png"):
        image.rename(images / "test" / f"{image.parent.name}-{image.name}")
    for folder in (images / "test").iterdir():
        if folder.is_dir():
            folder.rmdir()


IMAGE_FOLDER_CASES = {
    "empty split folder": (_empty_split, "", "holds no class folders and no images"),
    "missing split folder": (
        lambda images: shutil.rmtree(images / "test"),
        "",
        "does not exist; the split folders of {images} are: train, validation",
    ),
    "class folders without images": (
        _empty_class_folders,
        "",
        "holds no images: its class folders horizontal, vertical hold no .jpg, .jpeg or .png file",
    ),
    "images outside class folders": (
        _no_class_folders,
        "",
        "holds 4 images but no class folders: put each image in a folder named after its class",
    ),
    "split expression": (
        lambda images: None,
        ", splits: {train: train, validation: validation, test: 'test[:50%]'}",
        "dataset.splits.test: 'test[:50%]' is not a split folder of dataset.image_folder "
        "{images}: an image folder's splits are read whole; name one of its split folders: "
        "test, train, validation",
    ),
}


@pytest.mark.parametrize("case", list(IMAGE_FOLDER_CASES), ids=list(IMAGE_FOLDER_CASES))
def test_an_image_folder_without_test_images_is_refused_naming_the_split_folder(
    pipelines_path: Path, tf_runtime, case: str
) -> None:
    breaks, splits, reason = IMAGE_FOLDER_CASES[case]
    folder = write_pipeline(pipelines_path, "bars")
    (folder / "pipeline.yaml").write_text(IMAGES_SPEC.format(splits=splits))
    images = (folder / "images").resolve()
    write_bar_images(
        images, {"train": 8, "validation": 4, "test": 4}, ("horizontal", "vertical"), 12
    )
    breaks(images)
    error = refused_here("bars")  # a SpecError: the first task's refusal, without a retry
    assert error.startswith(f"{folder / 'pipeline.yaml'}: "), error
    assert reason.format(images=images) in error, error
    if case != "split expression":
        assert f"dataset.image_folder: split folder {images / 'test'} (role test) " in error, error
    assert LAYOUT in error, error


def test_a_class_folder_without_images_is_named_in_a_warning(
    pipelines_path: Path, tf_runtime, caplog: pytest.LogCaptureFixture
) -> None:
    from stratoflow.config.run_plan import resolve_plan
    from stratoflow.data.datasets import prepare_dataset

    folder = write_pipeline(pipelines_path, "bars")
    (folder / "pipeline.yaml").write_text(IMAGES_SPEC.format(splits=""))
    images = (folder / "images").resolve()
    write_bar_images(
        images, {"train": 8, "validation": 4, "test": 4}, ("horizontal", "vertical"), 12
    )
    for image in (images / "train" / "vertical").iterdir():
        image.unlink()
    spec = resolve_plan("bars", {}).spec
    with caplog.at_level("WARNING", logger="stratoflow.data.datasets"):
        reference = prepare_dataset(spec.dataset, folder=spec.folder, problem_type=spec.task)
    assert reference.split_sizes == {"train": 4, "validation": 4, "test": 4}
    assert (
        f"dataset.image_folder: class folder {images / 'train' / 'vertical'} holds no .jpg, "
        ".jpeg or .png images: class 'vertical' has no train examples"
    ) in caplog.text


def test_a_gate_metric_the_task_does_not_produce_is_refused_at_parse_time() -> None:
    data = {
        "description": "d",
        "task": "regression",
        "dataset": {"name": "x"},
        "model": {"builder": "mlp"},
        "training": {},
        "evaluation": {"metric": "test_accuracy", "min": 0.9},
        "registered_model": "m",
    }
    with pytest.raises(
        SpecError,
        match=r"^/p/pipeline\.yaml: evaluation\.metric 'test_accuracy' is not a metric of task "
        r"'regression'; allowed: test_mae, test_rmse, test_loss$",
    ):
        parse_spec("p", data, source="/p/pipeline.yaml")
    data["evaluation"] = {"metric": "test_mae", "min": 3.0, "max": 5.0}
    with pytest.raises(SpecError, match=r"evaluation: give exactly one of min .* or max"):
        parse_spec("p", data, source="/p/pipeline.yaml")
    data["evaluation"] = {"min_accuracy": 0.9}
    data["task"] = "classification"
    gate = parse_spec("p", data, source="/p/pipeline.yaml").evaluation
    assert (gate.metric, gate.min, gate.higher_is_better) == ("test_accuracy", 0.9, True)


@pytest.mark.parametrize("example", ["starter", "penguins", "diabetes"])
def test_a_new_pipeline_passes_the_checks_of_its_own_code(
    pipelines_path: Path, tf_runtime, example: str
) -> None:
    from stratoflow.cli import main
    from stratoflow.config.run_plan import resolve_plan
    from stratoflow.data.datasets import prepare_dataset
    from stratoflow.training.validation import check_pipeline_code

    assert main.main(["new-pipeline", "mine", "--from", example]) == 0  # into the path's entry
    spec = resolve_plan("mine", {}).spec
    assert spec.folder == str(pipelines_path / "mine")
    # Its own code imports, builds a model that takes the data, and fits the target.
    reference = prepare_dataset(spec.dataset, folder=spec.folder, problem_type=spec.task)
    check_pipeline_code(spec, reference)


# --- the bundled tabular pipelines under the single-process strategies ------------------------


@pytest.fixture(scope="module")
def tabular(tf_runtime) -> dict[str, Any]:
    from stratoflow.data.datasets import prepare_dataset

    prepared = {}
    for name in ("penguins", "diabetes"):
        spec = load_spec(name)
        prepared[name] = prepare_dataset(spec.dataset, folder=spec.folder, problem_type=spec.task)
    return prepared


@pytest.mark.parametrize(
    ("strategy", "loop"),
    [
        ("one_device", "custom"),
        ("one_device", "fit"),
        ("mirrored", "custom"),
        ("central_storage", "custom"),
    ],
)
@pytest.mark.parametrize("pipeline", ["penguins", "diabetes"])
def test_the_tabular_pipelines_learn_under_each_strategy(
    tabular, tmp_path: Path, pipeline: str, strategy: str, loop: str
) -> None:
    from stratoflow.training.trainer import train

    spec = load_spec(pipeline)
    training = dataclasses.replace(
        spec.training, strategy=strategy, loop=loop, epochs=3, replicas=2, seed=3
    )
    result = train(dataclasses.replace(spec, training=training), tabular[pipeline], tmp_path)
    metric = "accuracy" if pipeline == "penguins" else "mae"
    first, last = result.history[0], result.history[-1]
    assert set(last) >= {"loss", metric, "val_loss", f"val_{metric}"}
    assert last["loss"] < first["loss"]
    if pipeline == "penguins":
        assert last["val_accuracy"] >= 0.85
    else:
        assert last["val_mae"] < 60.0  # predicting the mean scores about 64
    assert result.num_replicas == (1 if strategy == "one_device" else 2)
