"""The docs site's generated reference: every training setting, benchmark Param, command and flag
is on the page the site publishes, read from the code's own metadata, never from where the docs
happen to be built."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from stratoflow.cli import main, reference_pages
from stratoflow.config import clusters, locations
from stratoflow.config.params import benchmark_params
from stratoflow.config.training import settings_of

DOCS = locations.PROJECT_ROOT / "docs"


def published(page: str) -> str:
    """A reference page as the site shows it: its markers expanded."""
    return reference_pages.expand((DOCS / "reference" / page).read_text())


def table_rows(markdown: str) -> dict[str, str]:
    """First cell's code span → the whole row, for every table row of `markdown`."""
    rows = {}
    for line in markdown.splitlines():
        match = re.match(r"^\| `([^`]+)` \|", line)
        if match:
            rows[match.group(1)] = line
    return rows


def test_the_params_page_has_a_row_for_every_training_setting_and_benchmark_param() -> None:
    retrain, benchmark = published("params.md").split("\n## Strategy benchmark\n")
    rows = table_rows(retrain)

    for name, (_kind, setting) in settings_of().items():
        assert name in rows, f"docs/reference/params.md: no row for the setting {name!r}"
        assert setting.title in rows[name] and setting.help.split(";")[0] in rows[name], name
    benchmark_rows = table_rows(benchmark)
    for name, schema in benchmark_params().items():
        assert name in benchmark_rows, f"docs/reference/params.md: no benchmark Param {name!r}"
        assert schema["description"] in benchmark_rows[name], name
    # The bounds and choices a trigger is held to, as the form holds it.
    assert "[1, 1000]" in rows["epochs"] and "(0, 1]" in rows["learning_rate"]
    assert "`parameter_server`" in rows["strategy"] and "`--no-promote`" in rows["promote"]


def test_the_cli_page_has_every_command_and_every_flag() -> None:
    page = published("cli.md")
    parser = main.build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))

    for name, command in commands.choices.items():
        start = page.index(f"## `stratoflow {name}`")
        end = page.find("\n## ", start + 1)
        section = page[start : end if end >= 0 else None]
        arguments = [a for a in command._actions if not isinstance(a, argparse._HelpAction)]
        flags = [flag for a in arguments for flag in a.option_strings]
        missing = [flag for flag in flags if f"`{flag}`" not in section]
        assert not missing, f"docs/reference/cli.md, stratoflow {name}: no row for {missing}"


def test_the_pages_show_no_cluster_name_of_the_machine_that_builds_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The run flags' choices are the deployment's cluster names: the docs describe them, and
    # never publish the names (or addresses) configured where the site happens to be built.
    monkeypatch.setenv(clusters.RAY_CLUSTERS_ENV, json.dumps({"rack-secret": "10.9.8.7:6379"}))
    monkeypatch.setenv(
        clusters.STANDING_CLUSTERS_ENV,
        json.dumps({"standing-secret": {"worker": ["10.9.8.6:2222"], "ps": ["10.9.8.5:2222"]}}),
    )

    pages = published("cli.md") + published("params.md")

    assert "secret" not in pages and "10.9.8" not in pages
    assert "--ray-cluster NAME" in pages
    assert "a cluster name the deployment configures" in table_rows(pages)["--ray-cluster"]


def test_a_marker_naming_no_reference_fails_the_page() -> None:
    with pytest.raises(reference_pages.UnknownReference, match="cli-commands"):
        reference_pages.expand("# Page\n\n<!-- reference: cli-command -->\n")
