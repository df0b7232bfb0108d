"""Wiring shared by the DAG files: a refusal fails its task for good, without a retry.

A `SpecError` is decided by the pipeline spec and the run's conf alone (an unknown key, a batch
size the replicas cannot split, a strategy that cannot train the model): every retry would give
the same answer after the retry delay. Errors that a retry can change (MLflow unreachable, a
killed training process) keep the task's retries. This module defines no DAG.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from airflow.sdk.exceptions import AirflowFailException

from stratoflow.config.parsing import SpecError

Body = TypeVar("Body", bound=Callable[..., Any])


def no_retry_on_refusal(body: Body) -> Body:
    """Make a task body fail without retry when it raises `SpecError`, with the same message.

    Apply it below `@task`: the task still sees the body's signature (`functools.wraps`).
    """

    @functools.wraps(body)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return body(*args, **kwargs)
        except SpecError as error:
            raise AirflowFailException(f"{error} (refused: not retried)") from error

    return run  # type: ignore[return-value]
