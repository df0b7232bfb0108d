"""The launcher turns a child's failure into a clear exception, with real child processes."""

from __future__ import annotations

import pytest

from tasks.launcher import ChildProcessFailed, run_python_module


def test_a_native_tensorflow_crash_becomes_a_clear_failure():
    with pytest.raises(ChildProcessFailed) as failure:
        run_python_module("tests.tasks.native_crash_program", {}, name="training process")
    message = str(failure.value)
    assert "training process" in message
    assert "crashed with SIGABRT (a native crash inside TensorFlow)" in message
    assert "Check failed" in message  # the child's own last log lines are quoted


def test_a_python_error_in_the_training_process_is_reported_with_its_message(tmp_path):
    payload = {"pipeline": "no_such_pipeline", "config": {}}
    with pytest.raises(ChildProcessFailed, match="failed: SpecError: .*missing required key"):
        run_python_module("tasks.training_worker", payload, name="training process")


def test_a_result_is_returned():
    result = run_python_module("tests.tasks.echo_program", {"value": 41}, name="echo")
    assert result == {"value": 42}


def test_a_child_running_past_its_limit_is_killed():
    with pytest.raises(ChildProcessFailed, match="ran past its 2 s limit"):
        run_python_module(
            "tests.tasks.echo_program", {"sleep": 30}, name="sleeper", timeout_seconds=2
        )
