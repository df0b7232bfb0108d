"""Typed dataclasses from untyped mappings (YAML, run confs), every error naming its field."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any


class SpecError(ValueError):
    """A pipeline spec or a run's overrides are invalid; the message names the field."""


def require_mapping(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping, got {type(data).__name__}")
    return data


def build(cls: type, data: Any, where: str) -> Any:
    """Construct dataclass `cls` from `data`, checking keys and types recursively."""
    data = require_mapping(data, where)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise SpecError(
            f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(fields))}"
        )
    hints = typing.get_type_hints(cls)
    values = {}
    for key, f in fields.items():
        if key not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SpecError(f"{where}: missing required key {key!r}")
            continue
        values[key] = _coerce(hints[key], data[key], f"{where}.{key}".replace(": .", ": "))
    return cls(**values)


def _coerce(hint: Any, value: Any, where: str) -> Any:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return build(hint, value, where)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        (hint,) = [option for option in options if option is not type(None)]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            return build(hint, value, where)
        origin = typing.get_origin(hint)
    if origin is dict:
        return dict(require_mapping(value, where))
    if origin is list:
        if not isinstance(value, list):
            raise SpecError(f"{where}: expected a list, got {type(value).__name__}")
        (item_hint,) = typing.get_args(hint) or (Any,)
        if isinstance(item_hint, type) and dataclasses.is_dataclass(item_hint):
            return [build(item_hint, item, f"{where}[{i}]") for i, item in enumerate(value)]
        return list(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, float) and not math.isfinite(value):
        raise SpecError(f"{where}: expected a finite number, got {value!r}")
    if hint is Any:
        return value
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise SpecError(f"{where}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value
