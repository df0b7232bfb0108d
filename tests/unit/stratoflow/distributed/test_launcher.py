"""The launcher turns a child's failure into a clear exception, in bounded time, with real child
processes (tiny echo programs, so the timings measure the launcher, not TensorFlow's import)."""

from __future__ import annotations

import inspect
import json
import time

import pytest

from stratoflow.distributed import launcher
from stratoflow.distributed.launcher import (
    ChildProcessFailed,
    Member,
    run_cluster,
    run_python_module,
)
from tests.support.processes import ECHO_MODULE, cluster_children, kill_during

pytestmark = pytest.mark.integration

# The docs promise a dead member fails the task "at once" (measured 0.1-0.3 s); the bound
# leaves room for a slow CI machine yet catches a launcher that waits for the chief to notice.
FAILURE_BOUND_SECONDS = 3.0


def echo(name: str, **overrides: object) -> Member:
    """An echo member whose payload `overrides` differ from the cluster's ($ECHO_NAME: `name`)."""
    return Member(name, ECHO_MODULE, {"ECHO_OVERRIDES": json.dumps(overrides), "ECHO_NAME": name})


def named(name: str):
    """Picks the child started as echo member `name` (for `kill_during`)."""
    return lambda children: next(c for c in children if c.environ().get("ECHO_NAME") == name)


def test_a_native_tensorflow_crash_becomes_a_clear_failure():
    with pytest.raises(ChildProcessFailed) as failure:
        run_python_module("tests.support.native_crash_program", {}, name="training process")
    message = str(failure.value)
    assert "training process" in message
    assert "crashed with SIGABRT (a native crash inside TensorFlow)" in message
    # The child's own last log lines are quoted.
    assert "native crash program: mirrored training with a partial last batch" in message


def test_a_python_error_in_the_training_process_is_reported_with_its_message(tmp_path):
    # A payload whose plan is not one (no members): the training process refuses it, named.
    payload = {
        "plan": {"name": "no_such_pipeline"},
        "dataset": {},
        "run_dir": str(tmp_path),
        "system_metrics_seconds": 2.0,
    }
    with pytest.raises(
        ChildProcessFailed, match="failed: PlanError: the training payload: missing required key"
    ):
        run_python_module("stratoflow.training.worker", payload, name="training process")


def test_a_result_is_returned():
    result = run_python_module(ECHO_MODULE, {"value": 41}, name="echo")
    assert result == {"value": 42}


def test_every_report_a_member_printed_is_handed_over_before_the_result_returns():
    """Its reports reach the task's sink, in order, none logged as output; the last ones were
    printed just before the member wrote its result and exited."""
    from stratoflow.distributed.launcher import Member, run_cluster

    sent = [["epoch", {"epoch": n, "loss": 1.0 / n}] for n in range(1, 51)]
    sent.append(["system", {"time": 1.0, "metrics": {"cpu_utilization_percentage": 50.0}}])
    taken: list[list] = []
    member = Member("member", ECHO_MODULE)
    result = run_cluster(
        lambda: [member],
        "member",
        {"value": 1, "reports": sent},
        reports=lambda kind, data: taken.append([kind, data]),
    )
    assert result == {"value": 2}
    assert taken == sent


def test_a_child_running_past_its_limit_is_killed_at_the_limit():
    started = time.monotonic()
    with pytest.raises(ChildProcessFailed, match="sleeper .* ran past its 2 s limit; killed"):
        run_python_module(ECHO_MODULE, {"sleep": 30}, name="sleeper", timeout_seconds=2)
    elapsed = time.monotonic() - started
    assert 2 <= elapsed < 2 + FAILURE_BOUND_SECONDS
    assert cluster_children() == []


def test_a_killed_member_fails_the_cluster_at_once():
    members = [echo("result", announce=True), echo("member 1", announce=True)]
    killed = kill_during(
        # The time limit only ends a launcher that would never notice.
        lambda: run_cluster(lambda: members, "result", {"sleep": 600}, timeout_seconds=60),
        when=lambda: len(cluster_children()) == 2,
        victim=named("member 1"),
    )
    assert isinstance(killed.error, ChildProcessFailed)
    assert f"member 1 (pid {killed.victim_pid}) was killed by SIGKILL" in str(killed.error)
    assert killed.seconds_to_failure < FAILURE_BOUND_SECONDS
    assert cluster_children() == []


def test_a_member_slow_to_come_up_is_given_its_grace_period():
    """Member 1 comes up 5 s after the result member: inside an 8 s grace, so the run succeeds."""
    members = [echo("result", announce=True, sleep=9), echo("member 1", announce_after=5)]
    started = time.monotonic()
    result = run_cluster(
        lambda: members, "result", {"value": 1, "announce": True}, ready_timeout_seconds=8
    )
    assert result == {"value": 2}
    assert time.monotonic() - started >= 9  # the result member ran its course
    assert cluster_children() == []


def test_a_member_that_never_comes_up_fails_the_start_when_its_grace_ends():
    grace = 4.0
    members = [
        echo("member 0", announce=True),  # up at once
        echo("member 1"),  # hangs without announcing itself, as a stuck worker would
    ]
    started = time.monotonic()
    never_up = "member 1 .*never came up: member 1 not ready 4 s after the first member was"
    with pytest.raises(ChildProcessFailed, match=never_up):
        run_cluster(lambda: members, "member 0", {"sleep": 600}, ready_timeout_seconds=grace)
    elapsed = time.monotonic() - started
    # Member 0 comes up after its start, so the failure cannot come before the grace has passed.
    assert grace <= elapsed < grace + FAILURE_BOUND_SECONDS
    assert cluster_children() == []


def test_training_runs_get_the_documented_30_second_grace():
    """docs/how-to/strategies.md, "Supervision": a member not up 30 s after the first one fails
    the start; training (`stratoflow.tasks.train.run_training`) calls `run_cluster` without choosing
    a grace."""
    default = inspect.signature(run_cluster).parameters["ready_timeout_seconds"].default
    assert default == launcher.READY_TIMEOUT_SECONDS == 30


def _kill_each_time(name: str, times: int, run) -> tuple[object, list[int]]:
    """Run `run` in a thread and SIGKILL echo member `name` each time a new one is up, `times`
    times; what `run` returned or raised, and the killed pids."""
    import threading

    outcome: dict[str, object] = {}

    def go() -> None:
        try:
            outcome["result"] = run()
        except ChildProcessFailed as error:
            outcome["result"] = error

    thread = threading.Thread(target=go)
    thread.start()
    killed: list[int] = []
    deadline = time.monotonic() + 120
    while len(killed) < times and thread.is_alive():
        assert time.monotonic() < deadline, "the member never came (back) up"
        victims = [
            c
            for c in cluster_children()
            if c.environ().get("ECHO_NAME") == name and c.pid not in killed
        ]
        if victims:
            time.sleep(1.5)  # up and announced
            victims[0].kill()
            killed.append(victims[0].pid)
        time.sleep(0.05)
    thread.join(120)
    assert not thread.is_alive()
    return outcome["result"], killed


def test_a_rejoining_member_is_started_again_in_place_while_the_result_member_goes_on():
    """A parameter-server worker (`rejoins`): killed twice, started again twice, the result
    member never restarted; each restart counted with its time to come up again."""
    worker = Member("worker 1", ECHO_MODULE, {"ECHO_NAME": "worker 1"}, server=True, rejoins=True)
    members = [echo("result", announce=True, sleep=12), worker]
    restarts = launcher.Restarts(2)
    result, killed = _kill_each_time(
        "worker 1",
        2,
        lambda: run_cluster(
            lambda: members,
            "result",
            {"value": 1, "announce": True, "sleep": 600},
            restarts=restarts,
        ),  # fmt: skip
    )
    assert result == {"value": 2}
    assert [(r.member, r.in_place) for r in restarts.events] == [("worker 1", True)] * 2
    assert all(0 < (r.seconds_to_recover or 0) < 10 for r in restarts.events)
    assert cluster_children() == []


def test_a_lost_member_restarts_the_cluster_until_max_restarts_is_spent():
    members = [echo("result", announce=True), echo("member 1", announce=True)]
    restarts = launcher.Restarts(2)
    error, killed = _kill_each_time(
        "member 1",
        3,
        lambda: run_cluster(lambda: members, "result", {"sleep": 600}, restarts=restarts),
    )
    assert isinstance(error, launcher.MemberLost)
    assert f"member 1 (pid {killed[-1]}) was killed by SIGKILL" in str(error)
    assert "no restart left: max_restarts 2 spent" in str(error)
    assert [(r.member, r.in_place) for r in restarts.events] == [("member 1", False)] * 2
    # Each restarted cluster came up (its result member announced itself) before the next kill.
    assert len(killed) == 3
    assert cluster_children() == []


def test_an_error_is_not_restarted():
    members = [echo("result", announce=True), echo("member 1", announce=True, exit_code=3)]
    restarts = launcher.Restarts(2)
    with pytest.raises(ChildProcessFailed, match="member 1 .* exited with status 3") as failure:
        run_cluster(lambda: members, "result", {"sleep": 600}, restarts=restarts)
    assert not isinstance(failure.value, launcher.MemberLost)
    assert restarts.events == []
    assert cluster_children() == []
