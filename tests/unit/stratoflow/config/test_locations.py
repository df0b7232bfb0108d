"""Run folders: every run id Airflow accepts gets a folder of its own, strictly inside its DAG's
folder, and removing one run's folder leaves every other run's folder alone."""

from __future__ import annotations

import itertools
import logging
import string
from pathlib import Path

import pytest

from stratoflow.config import locations

DAG_ID = "retrain_digits"

# Ids Airflow 3.3 accepts (checked below with its own validator) that a file name cannot take as
# they are: dots alone, leading or trailing dots, `:`/`+`/`~`, a trailing newline (`$` matches
# before it), ids the old mapping merged (`a:b`, `a+b`, `a~b`, `a_b`), ids differing only by
# case, the scheduler's own ids, and the longest id the metadata DB stores (250 characters).
AIRFLOW_ACCEPTS = [
    ".",
    ".a",
    "a.",
    ".hidden",
    "~",
    "+",
    ":",
    "-",
    "_",
    "a:b",
    "a+b",
    "a~b",
    "a_b",
    "a.b",
    "A_B",
    "manual",
    "Manual",
    "MANUAL",
    "a\n",
    "manual__2026-12-02T19:02:11+00:00",
    "manual__2026-12-02T19_02_11_00_00",
    "scheduled__2026-12-02T19:02:11+00:00",
    "asset_triggered__2026-12-02T19:02:11.123456+00:00",
    "x" * 250,
    "x" * 249 + "y",
    ":" * 250,
    ":" * 249 + "+",
]
# Ids the default configuration refuses, but a deployment's `allowed_run_id_pattern` or
# `allow_double_dot_in_ids` may let through: the mapping must hold for them too.
CONFIGURABLE = [
    "..",
    "...",
    "a/b",
    "../a",
    "a\\b",
    "/",
    "é",
    "e\u0301",
    "日本",
    "🙂",
    "a\x00b",
    "%",
    "a%3Ab",
]


def _airflow_validates(run_id: str) -> bool:
    from airflow.models.dagrun import DagRun

    try:
        DagRun.validate_run_id(None, "run_id", run_id)  # the check of `DagRun.run_id`
    except ValueError:
        return False
    return True


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(locations.STATE_DIR_ENV, str(tmp_path))
    return tmp_path


def test_the_awkward_ids_are_ones_airflow_accepts_or_refuses_by_default() -> None:
    assert [i for i in AIRFLOW_ACCEPTS if not _airflow_validates(i)] == []
    assert [i for i in CONFIGURABLE if _airflow_validates(i)] == []


def test_every_id_gets_a_distinct_folder_strictly_inside_its_dag_folder(state: Path) -> None:
    # Every id of up to 3 characters over Airflow's run-id alphabet (with a few letters), plus
    # the awkward ones: 33,000 ids.
    alphabet = "aAz09_.~:+-"
    short = ["".join(p) for n in (1, 2, 3) for p in itertools.product(alphabet, repeat=n)]
    ids = sorted(set(short + AIRFLOW_ACCEPTS + CONFIGURABLE))
    dag_dir = state / "runs" / DAG_ID

    folders = [locations.run_dir(DAG_ID, run_id) for run_id in ids]

    assert len(set(folders)) == len(ids)
    for run_id, folder in zip(ids, folders, strict=True):
        assert folder.parent == dag_dir, run_id
        assert folder.name not in ("", ".", ".."), run_id
        assert not set(folder.name) & {"/", "\\", "\x00", "\n"}, run_id
        assert len(folder.name.encode()) <= 255, run_id
        assert folder.resolve().parent == dag_dir.resolve(), run_id


def test_the_folders_exist_side_by_side_on_disk(state: Path) -> None:
    ids = AIRFLOW_ACCEPTS + [i for i in CONFIGURABLE if i != "a\x00b"]  # NUL: no file name has it
    for run_id in ids:
        folder = locations.run_dir(DAG_ID, run_id)
        folder.mkdir(parents=True)
        (folder / "owner.txt").write_text(run_id)

    dag_dir = state / "runs" / DAG_ID
    owners = sorted((child / "owner.txt").read_text() for child in dag_dir.iterdir())
    assert owners == sorted(ids)  # one folder per id, none shared, none outside


def test_ordinary_ids_stay_readable() -> None:
    assert locations.folder_name("manual__2026-12-02T19:02:11+00:00") == (
        "manual__2026-12-02T19%3A02%3A11%2B00%3A00"
    )
    assert locations.folder_name("retrain_digits") == "retrain_digits"
    assert locations.folder_name(".") == "%2E"
    long_name = locations.folder_name("x" * 250)
    assert long_name.startswith("x" * 160 + "~") and len(long_name) == 225
    with pytest.raises(ValueError, match="empty"):
        locations.folder_name("")


@pytest.mark.parametrize("removed", [".", "a:b", "a_b", "Manual", "a\n", "x" * 250])
def test_removing_a_run_folder_keeps_every_sibling(state: Path, removed: str) -> None:
    for run_id in AIRFLOW_ACCEPTS:
        folder = locations.run_dir(DAG_ID, run_id)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.keras").write_text(run_id)
    (state / "runs" / "retrain_mnist").mkdir()

    assert locations.remove_run_dir(DAG_ID, removed)

    assert not locations.run_dir(DAG_ID, removed).exists()
    for run_id in AIRFLOW_ACCEPTS:
        if run_id != removed:
            assert (locations.run_dir(DAG_ID, run_id) / "model.keras").read_text() == run_id
    assert (state / "runs" / "retrain_mnist").is_dir()


def test_a_run_folder_that_resolves_elsewhere_is_refused_not_deleted(
    state: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sibling = locations.run_dir(DAG_ID, "manual__1")
    sibling.mkdir(parents=True)
    (sibling / "model.keras").write_text("keep")
    outside = state / "elsewhere"
    outside.mkdir()
    (outside / "data").write_text("keep")
    locations.run_dir(DAG_ID, "linked").symlink_to(sibling)
    locations.run_dir(DAG_ID, "escaping").symlink_to(outside)

    with caplog.at_level(logging.ERROR, logger="stratoflow.config.locations"):
        assert not locations.remove_run_dir(DAG_ID, "linked")
        assert not locations.remove_run_dir(DAG_ID, "escaping")

    assert (sibling / "model.keras").read_text() == "keep"
    assert (outside / "data").read_text() == "keep"
    assert sum("not deleting" in message for message in caplog.messages) == 2


def test_a_part_of_a_run_folder_is_removed_alone(state: Path) -> None:
    folder = locations.run_dir(DAG_ID, ".")
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "model.keras").write_text("model")

    assert locations.remove_run_dir(DAG_ID, ".", "checkpoints")

    assert not (folder / "checkpoints").exists()
    assert (folder / "model.keras").read_text() == "model"


def test_dag_ids_map_the_same_way() -> None:
    assert locations.run_dir("retrain_mnist", "r").parent.name == "retrain_mnist"
    names = {
        locations.folder_name(dag_id) for dag_id in ("a.b", "a_b", "a-b", string.ascii_letters)
    }
    assert len(names) == 4
