"""Why each task of an `airflow dags test` run failed, read from its output as it streams.

Airflow keeps a task's exception nowhere but in its log: the metadata DB says which task
failed, not why, and `airflow dags test` writes no log files. Its output (stdout, Airflow's
console log renderer) marks each task's start with `[DAG TEST] starting task_id=...` and each
failure with a `Task failed with exception` event followed by the plain Python traceback. This
module follows those markers line by line and keeps, per task, the exception of its last
failed try: its type (the class name) and its message, as the task body raised it (a refusal's
`AirflowFailException` is unwrapped to the `SpecError` it was raised from:
`stratoflow/dags/refusals.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Airflow's console renderer starts every event with an ISO timestamp and the padded level.
_EVENT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z? \[")
_TASK_START = re.compile(r"\[DAG TEST\] starting task_id=(\S+) map_index=(-?\d+)")
_TASK_FAILED = "Task failed with exception"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TRACEBACK = "Traceback (most recent call last):"
_CAUSE = "The above exception was the direct cause of the following exception:"
_CONTEXT = "During handling of the above exception, another exception occurred:"
# `stratoflow/dags/refusals.py` raises it from the refusal (a SpecError) to fail the task without a
# retry.
_REFUSAL_WRAPPER = "AirflowFailException"
# A failure's traceback is kept up to this many lines (a member's log tail is about 30).
MAX_TRACEBACK_LINES = 2000
# What a message shows of a long multi-line message: its first line and its last lines.
MESSAGE_TAIL_LINES = 10


@dataclass(frozen=True)
class TaskFailure:
    """The exception a task's last failed try raised.

    Attributes:
        task_id: the task instance (`task_label`: the task id, `[index]` if mapped).
        error_type: the exception's class name, e.g. "SpecError".
        message: its message (may span lines: a training process's last log lines).
    """

    task_id: str
    error_type: str
    message: str

    def describe(self) -> str:
        """`<task> failed: <Type>: <message>`; a long message keeps its first and last lines."""
        lines = self.message.splitlines() or [""]
        if len(lines) > MESSAGE_TAIL_LINES + 1:
            omitted = len(lines) - MESSAGE_TAIL_LINES - 1
            lines = [lines[0], f"  ({omitted} lines omitted)", *lines[-MESSAGE_TAIL_LINES:]]
        head = f"{self.task_id} failed: {self.error_type}" + (f": {lines[0]}" if lines[0] else "")
        return "\n".join([head, *lines[1:]])


class TaskFailureReader:
    """Takes the output of `airflow dags test` line by line; `failures` is what it found."""

    def __init__(self) -> None:
        self.failures: dict[str, TaskFailure] = {}
        self._task: str | None = None
        self._traceback: list[str] | None = None  # inside a failure's traceback

    def take_line(self, line: str) -> None:
        """Read one line of output (with or without its line ending)."""
        line = _ANSI.sub("", line.rstrip("\r\n"))
        if self._traceback is not None:
            if not _EVENT.match(line):
                if len(self._traceback) < MAX_TRACEBACK_LINES:
                    self._traceback.append(line)
                return
            self._end_traceback()
        if not _EVENT.match(line):
            return
        started = _TASK_START.search(line)
        if started:
            self._task = task_label(started.group(1), int(started.group(2)))
        elif _TASK_FAILED in line and self._task is not None:
            self._traceback = []

    def finish(self) -> None:
        """The output ended: keep a traceback that was still being read."""
        if self._traceback is not None:
            self._end_traceback()

    def _end_traceback(self) -> None:
        assert self._traceback is not None and self._task is not None
        error = raised_exception(self._traceback)
        if error is not None:
            self.failures[self._task] = TaskFailure(self._task, *error)
        self._traceback = None


def task_label(task_id: str, map_index: int) -> str:
    """How a task instance is named: its task id, and `[index]` for a mapped one."""
    return task_id if map_index < 0 else f"{task_id}[{map_index}]"


def raised_exception(traceback_lines: list[str]) -> tuple[str, str] | None:
    """The (class name, message) of the exception a printed traceback ends with.

    A chain (`raise ... from`, or an exception while handling another) prints each exception
    in turn and the raised one last; only the refusal wrapper of `stratoflow/dags/refusals.py` is
    looked through, to the exception it was raised from.
    """
    sections: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in traceback_lines:
        if line in (_CAUSE, _CONTEXT):
            sections.append((line, []))
        else:
            sections[-1][1].append(line)
    errors = [_exception_of(lines) for _, lines in sections]
    raised = errors[-1]
    if raised is not None and raised[0] == _REFUSAL_WRAPPER and sections[-1][0] == _CAUSE:
        return errors[-2] or raised
    return raised


def _exception_of(lines: list[str]) -> tuple[str, str] | None:
    """(class name, message) of one section of a traceback: the text after its frames."""
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    if _TRACEBACK in lines:
        lines = lines[lines.index(_TRACEBACK) + 1 :]
        # Frames are `  File "...", line N, in f` with their code and carets indented deeper.
        start = 0
        while start < len(lines) and (
            lines[start].startswith(('  File "', "    ", "  [Previous line repeated"))
        ):
            start += 1
        lines = lines[start:]
    while lines and not lines[0].strip():
        lines = lines[1:]
    if not lines:
        return None
    qualified, _, first = lines[0].partition(": ")
    if not re.fullmatch(r"[\w.]+", qualified):
        return None
    return qualified.rsplit(".", 1)[-1], "\n".join([first, *lines[1:]]).strip("\n")
