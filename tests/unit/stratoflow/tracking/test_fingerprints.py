"""The three fingerprints a skip decision compares: what changes them and what does not."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from stratoflow.config.run_plan import resolve_plan
from stratoflow.config.spec import load_spec
from stratoflow.tracking import fingerprints
from stratoflow.tracking.fingerprints import Fingerprints

DATASET = {"name": "stratoflow_digits", "config": None, "version": "1.0.0", "fingerprint": "ab"}


def config_of(**conf: object) -> str:
    return fingerprints.config_fingerprint(resolve_plan("digits", conf).spec)


def test_the_config_fingerprint_ignores_what_does_not_change_the_model() -> None:
    base = config_of()
    assert config_of(promote=False, force=True, max_restarts=0) == base
    spec = resolve_plan("digits", {}).spec
    described = dataclasses.replace(
        spec, description="other", schedule=None, owner="x", tags=["y"], retries=0
    )
    assert fingerprints.config_fingerprint(described) == base


@pytest.mark.parametrize(
    "conf",
    [{"epochs": 3}, {"learning_rate": 0.01}, {"seed": 1}, {"strategy": "mirrored"}],
    ids=["epochs", "learning_rate", "seed", "strategy"],
)
def test_the_config_fingerprint_changes_with_what_shapes_the_model(conf: dict) -> None:
    assert config_of(**conf) != config_of()


def test_the_dataset_fingerprint_changes_with_content_and_version() -> None:
    base = fingerprints.dataset_fingerprint(DATASET)
    assert fingerprints.dataset_fingerprint(dict(DATASET)) == base
    assert fingerprints.dataset_fingerprint({**DATASET, "fingerprint": "cd"}) != base
    assert fingerprints.dataset_fingerprint({**DATASET, "version": "1.0.1"}) != base


def test_the_code_fingerprint_follows_the_pipelines_code_not_its_spec_or_caches(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "penguins"
    shutil.copytree(Path(load_spec("penguins").folder), folder)
    base = fingerprints.code_fingerprint(folder)
    (folder / "__pycache__").mkdir(exist_ok=True)
    (folder / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"cache")
    (folder / "pipeline.yaml").write_text((folder / "pipeline.yaml").read_text() + "\n# note\n")
    assert fingerprints.code_fingerprint(folder) == base
    model = folder / "model.py"
    model.write_text(model.read_text() + "\n# a change\n")
    assert fingerprints.code_fingerprint(folder) != base


def test_fingerprints_go_to_tags_and_back() -> None:
    recorded = Fingerprints(dataset="d" * 64, code="c" * 64, config="f" * 64)
    tags = recorded.tags()
    assert set(tags) == {
        "stratoflow.fingerprint.dataset",
        "stratoflow.fingerprint.code",
        "stratoflow.fingerprint.config",
    }
    assert Fingerprints.from_tags({**tags, "other": "x"}) == recorded
    assert Fingerprints.from_tags({"stratoflow.fingerprint.dataset": "d"}) is None  # older run
    assert recorded.differences(dataclasses.replace(recorded, code="e" * 64)) == ["code"]


@pytest.mark.parametrize(
    ("run_type", "force", "may_skip"),
    [
        ("scheduled", False, True),
        ("asset_triggered", False, True),
        ("scheduled", True, False),
        ("manual", False, False),
        ("backfill", False, False),
        ("", False, False),
    ],
)
def test_only_unattended_unforced_runs_may_skip(run_type: str, force: bool, may_skip: bool) -> None:
    assert fingerprints.may_skip(run_type, force) is may_skip
