"""The docs site builds as `make docs` builds it, strictly: a broken link, anchor, include or
reference marker fails CI here. A page under docs/guide/ joins the navigation by itself, and the
README's links lead to files that exist."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import yaml

from stratoflow.config import locations

ROOT = locations.PROJECT_ROOT
DOCS = ROOT / "docs"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,  # the changelog's include is relative to the repository, as for `make docs`
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-4000:]}"
    assert "WARNING" not in result.stderr, result.stderr[-4000:]
    # The generated tables and the included changelog are in the pages, not their markers.
    params = (site / "reference" / "params" / "index.html").read_text()
    assert "<!-- reference:" not in params and "cache_budget_mb" in params
    assert "Keep a Changelog" in (site / "changelog" / "index.html").read_text()
    # benchmarks/run.py writes docs/BENCHMARKS.md: the site publishes that very file.
    assert (site / "BENCHMARKS" / "index.html").is_file()


def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hook", DOCS / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_page_under_guide_joins_the_navigation_after_the_how_to_guides(tmp_path: Path) -> None:
    (tmp_path / "guide").mkdir()
    for name in ("skip-unchanged.md", "approval.md", "index.md"):
        (tmp_path / "guide" / name).write_text(f"# {name}\n")
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    config = hook().on_config({"docs_dir": str(tmp_path), "nav": nav})

    titles = [next(iter(item)) for item in config["nav"]]
    assert titles.index("Guides") == titles.index("How-to guides") + 1
    guides = config["nav"][titles.index("Guides")]["Guides"]
    assert guides == ["guide/index.md", "guide/approval.md", "guide/skip-unchanged.md"]


def test_the_readme_links_to_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [target for target in targets if "://" not in target]

    assert "docs/tutorials/first-run.md" in local
    missing = [target for target in local if not (ROOT / target).is_file()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_the_pipeline_yaml_page_names_every_key_a_spec_takes() -> None:
    import dataclasses

    from stratoflow.config.spec import DatasetSpec, EvaluationGate, ModelSpec, PipelineSpec

    page = (DOCS / "reference" / "pipeline-yaml.md").read_text()
    named = set(re.findall(r"`([a-z_]+)", page))
    # The pipeline's name and folder are its folder's, never keys of the file.
    top = {f.name for f in dataclasses.fields(PipelineSpec)} - {"name", "folder"}
    sections = {"dataset": DatasetSpec, "model": ModelSpec, "evaluation": EvaluationGate}
    keys = top | {
        f"{section}.{f.name}"
        for section, spec in sections.items()
        for f in dataclasses.fields(spec)
    }

    missing = sorted(key for key in keys if key.split(".")[-1] not in named)
    assert not missing, f"docs/reference/pipeline-yaml.md names no key {missing}"
