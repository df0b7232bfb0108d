"""What every task body shares: the DAG run it belongs to, and the checks that turn an XCom dict
back into a typed result with a clear error.

Task bodies hand each other small dataclasses (`to_dict` for XCom, `from_dict` back); this module
holds the pieces those dataclasses have in common. Importing it is cheap (no TensorFlow, no
MLflow).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, ClassVar, Self, TypeVar

from stratoflow.config.parsing import SpecError
from stratoflow.config.run_plan import RunPlan
from stratoflow.data.datasets import DatasetRef

Step = TypeVar("Step", bound=Callable[..., Any])
Value = TypeVar("Value")


class PayloadError(ValueError):
    """A task's input from XCom is not the typed result it expects; the message names the key."""


class XComResult:
    """A task's typed result, which crosses XCom as a small JSON dict.

    A subclass is a dataclass naming the task whose XCom it is (`PRODUCER`). Its fields may be
    JSON scalars, lists, dicts, `DatasetRef`, `RunPlan` (a run's plan) or other
    dataclasses; `to_dict` turns them into JSON types and `from_dict` checks every key and type
    on the way back.
    """

    PRODUCER: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON types (what XCom stores)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        """Rebuild the result from `to_dict()` output.

        Raises:
            PayloadError: a key is missing or unknown, or a value has the wrong type; the message
                names the task it came from and the key.
        """
        return typing.cast(Self, _build(cls, data, f"the result of {cls.PRODUCER}"))


def _plain(value: Any) -> Any:
    if isinstance(value, DatasetRef):
        return value.to_dict()
    if isinstance(value, RunPlan):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _build(cls: type, data: Any, what: str, prefix: str = "") -> Any:
    """Dataclass `cls` from `data`; `prefix` is the path of a nested one (e.g. "gate.")."""
    values = checked_fields(cls, data, f"{what}: {prefix[:-1]}" if prefix else what)
    hints = typing.get_type_hints(cls)
    return cls(
        **{key: _typed_as(hints[key], value, prefix + key, what) for key, value in values.items()}
    )


def _typed_as(hint: Any, value: Any, key: str, what: str) -> Any:
    """`value` as type `hint`: checked, and rebuilt when `hint` is a dataclass."""
    if hint is Any:
        return value
    if hint is DatasetRef:
        try:
            return DatasetRef.from_dict(typed(value, dict, key, what))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise PayloadError(f"{what}: {key} is not a dataset reference: {error}") from None
    if hint is RunPlan:
        return plan_from_dict(value, f"{what}: {key}")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value, what, prefix=f"{key}.")
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (hint,) = [arg for arg in args if arg is not type(None)]
        return _typed_as(hint, value, key, what)
    if origin is dict:
        return {
            str(name): _typed_as(args[1], item, f"{key}.{name}", what)
            for name, item in typed(value, dict, key, what).items()
        }
    if origin is list:
        return [_typed_as(args[0], item, key, what) for item in typed(value, list, key, what)]
    return typed(value, hint, key, what)


def freezes_heap(step: Step) -> Step:
    """After `step`, move every object alive into the collector's permanent generation.

    A step leaves TensorFlow, Keras and MLflow imported: millions of long-lived objects that each
    later full collection walks again, and so does the interpreter's last collection at exit
    (seconds at the end of every `airflow dags test`). Frozen objects are never scanned again;
    the process ends with its DAG run (`dags test`) or its task (a scheduler's task process), so
    the few cycles frozen with them are not worth a collection.
    """

    @functools.wraps(step)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return step(*args, **kwargs)
        finally:
            gc.freeze()

    return run  # type: ignore[return-value]


@dataclass(frozen=True)
class AirflowRun:
    """Which DAG run a step belongs to (from the Airflow context, or made up by a test).

    Attributes:
        dag_id: the DAG.
        run_id: the DAG run.
        try_number: the task's try.
        triggered_by: the Airflow user who triggered the DAG run; for a run no user triggered,
            its run type in parentheses (`(scheduled)`, `(asset_triggered)`); empty outside
            Airflow.
        run_type: Airflow's run type (`manual`, `scheduled`, `asset_triggered`, ...); empty
            outside Airflow.
    """

    dag_id: str
    run_id: str
    try_number: int = 1
    triggered_by: str = ""
    run_type: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_context(cls, context: Any) -> AirflowRun:
        """The DAG run of an Airflow task context (`dag`, `run_id`, `ti`, `dag_run`)."""
        return cls(
            dag_id=context["dag"].dag_id,
            run_id=context["run_id"],
            try_number=context["ti"].try_number,
            triggered_by=triggered_by(context.get("dag_run")),
            run_type=run_type_of(context.get("dag_run")),
        )


def run_type_of(dag_run: Any) -> str:
    """A DAG run's type as its plain value (`scheduled`, `manual`, ...), or "" without one."""
    run_type = getattr(dag_run, "run_type", None)
    return str(getattr(run_type, "value", run_type) or "")


def triggered_by(dag_run: Any) -> str:
    """Who triggered a DAG run: Airflow's `triggering_user_name` (the signed-in user of the UI or
    REST API, the OS user of `airflow dags trigger`, `dag_test` for `airflow dags test`), or,
    when no user did, the run type in parentheses."""
    if dag_run is None:
        return ""
    user = getattr(dag_run, "triggering_user_name", None)
    if user:
        return str(user)
    run_type = getattr(dag_run, "run_type", None)
    return f"({getattr(run_type, 'value', run_type)})" if run_type else ""


def plan_from_dict(data: Any, what: str) -> RunPlan:
    """A run's plan from XCom (`RunPlan.to_dict` output), checked once (`RunPlan.from_dict`).

    Raises:
        PayloadError: not a plan; the message names where it came from and the field.
    """
    try:
        return RunPlan.from_dict(data, what)
    except SpecError as error:
        raise PayloadError(str(error)) from None


def checked_fields(cls: type, data: Any, what: str) -> dict[str, Any]:
    """`data` as keyword arguments of dataclass `cls`, after checking its keys.

    Args:
        cls: the dataclass `data` should describe.
        data: a dict from XCom (`cls.to_dict()` output).
        what: where it came from, for the error message (e.g. "the result of train_model").

    Raises:
        PayloadError: `data` is not a mapping, lacks a required key or has an unknown one.
    """
    if not isinstance(data, Mapping):
        raise PayloadError(
            f"{what}: expected a {cls.__name__} as a dict, got {type(data).__name__} {data!r:.200}"
        )
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    missing = [
        name
        for name, f in known.items()
        if name not in data and f.default is MISSING and f.default_factory is MISSING
    ]
    if unknown or missing:
        problems = [f"missing key {name!r}" for name in missing]
        problems += [f"unknown key {name!r}" for name in unknown]
        raise PayloadError(
            f"{what} is not a {cls.__name__}: {', '.join(problems)}; "
            f"expected keys: {', '.join(known)}"
        )
    return dict(data)


def typed(value: Any, kind: type[Value], key: str, what: str) -> Value:
    """`value` if it is a `kind` (an int also counts as a float, a bool never as a number).

    Raises:
        PayloadError: it is not; the message names `key` and where it came from.
    """
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)  # type: ignore[return-value]
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise PayloadError(
        f"{what}: {key} must be {kind.__name__}, got {type(value).__name__} {value!r:.100}"
    )
