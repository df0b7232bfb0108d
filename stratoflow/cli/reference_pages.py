"""The docs site's generated reference: the Params and the CLI, made from the code's own metadata.

The training settings' `Setting` metadata (`stratoflow.config.training`), the strategy benchmark's
Param declarations (`stratoflow.config.params.benchmark_params`) and the `stratoflow` parser
(`stratoflow.cli.main.build_parser`) are what the DAGs, the trigger form and `--help` are made
from; the reference pages are made from them too, at build time, so they cannot drift. A page
asks for a table with a marker line, `<!-- reference: NAME -->` (NAME one of `REFERENCES`);
`docs/hooks/reference.py` expands the markers while MkDocs builds the site.
"""

from __future__ import annotations

import argparse
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from stratoflow.cli.main import build_parser
from stratoflow.config.params import benchmark_params
from stratoflow.config.training import Setting, TrainingConfig, settings_of

MARKER = re.compile(r"^<!-- reference: ([a-z-]+) -->$", re.M)

# Where the deployment's cluster names are explained, relative to a page under docs/reference/.
_NAMED_CLUSTERS = "../how-to/several-machines.md#named-clusters-where-training-may-run"


def _cell(text: object) -> str:
    """`text` made safe for one cell of a Markdown table: no pipe, no raw HTML; each of its lines
    a line of the cell."""
    safe = str(text).replace("|", r"\|").replace("<", "&lt;")
    return "<br>".join(" ".join(line.split()) for line in safe.splitlines())


def _code(value: object) -> str:
    if value is None or value == "":
        return "empty"
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def _row(cells: Iterable[object]) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def _table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    header = list(header)
    return "\n".join([_row(header), _row("---" for _ in header), *(_row(row) for row in rows)])


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _choice(value: object, text: str) -> str:
    """A choice and what the trigger form's dropdown says of it, when it says more than its name."""
    prefix = f"{value}: "
    return f"`{value}`: {text.removeprefix(prefix)}" if text.startswith(prefix) else f"`{value}`"


def _allowed(setting: Setting) -> str:
    """What a setting accepts, in words: its choices, its bounds, or the deployment's names."""
    if setting.choices_from is not None:
        return f"a cluster name the deployment configures ([named clusters]({_NAMED_CLUSTERS}))"
    if setting.choices is not None:
        described = any(
            str(text).startswith(f"{value}: ") for value, text in setting.choices.items()
        )
        choices = [_choice(value, text) for value, text in setting.choices.items()]
        return "\n".join(choices) if described else ", ".join(choices)
    low = (
        f"({_number(setting.above)}"
        if setting.above is not None
        else (f"[{_number(setting.minimum)}" if setting.minimum is not None else "(-∞")
    )
    high = f"{_number(setting.maximum)}]" if setting.maximum is not None else "∞)"
    if low == "(-∞" and high == "∞)":
        return "any"
    return f"{low}, {high}"


def training_settings() -> str:
    """The table of a retrain DAG's Params: one row per training setting, in the form's order."""
    defaults = TrainingConfig()
    rows = []
    for name, (kind, setting) in settings_of().items():
        default = getattr(defaults, name)
        flag = f"--no-{name}" if kind is bool else f"--{name}"
        allowed = "true, false" if kind is bool else _allowed(setting)
        optional = ", or empty / null" if setting.optional else ""
        rows.append(
            (
                f"`{name}`",
                f"`{flag.replace('_', '-')}`",
                kind.__name__,
                _code(default),
                _cell(allowed) + optional,
                f"**{_cell(setting.title)}.** {_cell(setting.help)}",
            )
        )
    return _table(("Param", "`stratoflow run` flag", "type", "default", "allowed", "meaning"), rows)


def _schema_allowed(schema: Mapping[str, Any]) -> str:
    if schema["type"] == "array":
        return "a list of: " + ", ".join(f"`{value}`" for value in schema["items"]["enum"])
    low = (
        f"({_number(schema['exclusiveMinimum'])}"
        if "exclusiveMinimum" in schema
        else f"[{_number(schema['minimum'])}"
    )
    return f"{low}, {_number(schema['maximum'])}]"


def benchmark_settings() -> str:
    """The table of the strategy benchmark's Params (and `stratoflow benchmark`'s flags)."""
    rows = [
        (
            f"`{name}`",
            f"`--{name.replace('_', '-')}`",
            schema["type"],
            _code(schema["default"]) if schema["default"] != [] else "empty list",
            _cell(_schema_allowed(schema)),
            f"**{_cell(schema['title'])}.** {_cell(schema['description'])}",
        )
        for name, schema in benchmark_params().items()
    ]
    return _table(
        ("Param", "`stratoflow benchmark` flag", "type", "default", "allowed", "meaning"), rows
    )


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _command_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {choice.dest: choice.help or "" for choice in action._choices_actions}


def _argument_name(action: argparse.Action) -> str:
    names = action.option_strings or [str(action.metavar or action.dest)]
    # A table cell's pipe stays escaped inside a code span: such a name is shown as plain text.
    return ", ".join(_cell(name) if "|" in name else f"`{name}`" for name in names)


def _deployment_setting(action: argparse.Action) -> Setting | None:
    """The training setting whose flag `action` is, when its values are the deployment's."""
    entry = settings_of().get(action.dest)
    if entry is None or entry[1].choices_from is None or action.help != entry[1].help:
        return None
    return entry[1]


def _argument_values(action: argparse.Action) -> str:
    setting = _deployment_setting(action)
    if setting is not None:
        return _allowed(setting)  # the deployment's names, not those of where the docs build
    if not action.option_strings:
        return ", ".join(f"`{c}`" for c in action.choices) if action.choices else "(positional)"
    if action.nargs == 0:
        return "(a switch)"
    if action.choices is not None:
        return ", ".join(f"`{choice}`" for choice in action.choices)
    return f"`{action.metavar or action.dest.upper()}`"


def _argument_help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {"default": action.default, "prog": "stratoflow"}
    shown = action.default not in (None, argparse.SUPPRESS, False) and "default" not in text
    if shown and action.option_strings:
        text += f" (default: `{action.default}`)"
    return text


def cli_commands() -> str:
    """Every `stratoflow` command with its usage and a table of its arguments and flags."""
    parser = build_parser()
    helps = _command_helps(parser)
    sections = []
    for name, command in _subcommands(parser).items():
        arguments = [a for a in command._actions if not isinstance(a, argparse._HelpAction)]
        for action in arguments:
            if _deployment_setting(action) is not None:
                action.metavar = "NAME"  # not the names configured where the docs are built
        prefix = "usage: "
        usage = textwrap.dedent(" " * len(prefix) + command.format_usage().removeprefix(prefix))
        table = (
            _table(
                ("argument", "values", "meaning"),
                (
                    (_argument_name(a), _cell(_argument_values(a)), _cell(_argument_help(a)))
                    for a in arguments
                ),
            )
            if arguments
            else ""
        )
        summary = helps.get(name, "")
        paragraphs = [f"## `stratoflow {name}`", f"{summary[:1].upper()}{summary[1:]}."]
        paragraphs += [f"```\n{usage.strip()}\n```", command.description or "", table]
        sections.append("\n\n".join(p for p in paragraphs if p))
    return "\n\n".join(sections)


REFERENCES: dict[str, Callable[[], str]] = {
    "training-settings": training_settings,
    "benchmark-settings": benchmark_settings,
    "cli-commands": cli_commands,
}


class UnknownReference(ValueError):
    """A page asks for a reference table that does not exist."""


def expand(markdown: str) -> str:
    """`markdown` with each marker line replaced by the table it names.

    Raises:
        UnknownReference: a marker names no entry of `REFERENCES`.
    """

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in REFERENCES:
            raise UnknownReference(
                f"<!-- reference: {name} -->: no such reference; known: {', '.join(REFERENCES)}"
            )
        return REFERENCES[name]()

    return MARKER.sub(table, markdown)
