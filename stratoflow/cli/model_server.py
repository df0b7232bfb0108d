"""`stratoflow serve-model`: MLflow's scoring server for a pipeline's model, until stopped.

What is served and how the server is started is `stratoflow.tracking.model_serving`'s; this
module runs it the way `stratoflow run` runs `airflow dags test` (`stratoflow.cli.runner`): the
server in its own process group, so that Ctrl-C reaches only this process, which then stops the
server and every worker it forked; and the server gets SIGTERM if this process is killed.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from stratoflow.cli.runner import Stopped, ignoring_stop_signals, stop_on_signals
from stratoflow.config.parsing import SpecError
from stratoflow.distributed.processes import ManagedProcess, die_with_parent, stop_tree
from stratoflow.tracking import model_serving
from stratoflow.tracking.model_serving import HOST, ModelVersionToServe, ServingError, Usage

log = logging.getLogger(__name__)

# Importing TensorFlow and loading the model takes 10-30 s on 2 busy cores; a worker that has
# not answered in this long will not.
READY_TIMEOUT_SECONDS = 300
# uvicorn finishes the requests in flight on SIGTERM; after this long the rest is killed.
STOP_GRACE_SECONDS = 5


def serve_model(pipeline: str, alias: str, port: int, workers: int) -> int:
    """Serve `models:/<pipeline's registered model>@<alias>` on 127.0.0.1 until stopped.

    Args:
        pipeline: a pipeline name.
        alias: the registered model's alias to serve, e.g. `champion`.
        port: the TCP port on 127.0.0.1; 0 for a free one (the banner says which).
        workers: uvicorn worker processes, each with its own copy of the model in memory.

    Returns:
        1 when it could not serve (the reason is logged), 130 or 143 when SIGINT or SIGTERM
        stopped it, 1 when the scoring server ended by itself.
    """
    with stop_on_signals():
        try:
            return _serve(pipeline, alias, port, workers)
        except (SpecError, ServingError) as error:
            log.error("%s", error)
            return 1
        except Stopped as stopped:
            log.error("Stopped by %s before the model was served.", stopped)
            return 128 + stopped.signum


def _serve(pipeline: str, alias: str, port: int, workers: int) -> int:
    from stratoflow.distributed.cluster import free_ports

    problem = port_problem(port)
    if problem:
        raise ServingError(problem)
    model = model_serving.resolve_model(pipeline, alias)
    # A private folder (0700) for the copy, removed when serving ends.
    with tempfile.TemporaryDirectory(prefix="stratoflow-serve-") as folder:
        model_dir = model_serving.download_model(model, Path(folder))
        usage = model_serving.usage(model_dir)
        port = port or free_ports(1)[0]
        return _run_server(model, model_dir, usage, port, workers)


def _run_server(
    model: ModelVersionToServe, model_dir: Path, usage: Usage, port: int, workers: int
) -> int:
    argv, env = model_serving.scoring_server_command(model_dir, port, workers)
    url = f"http://{HOST}:{port}"
    log.info("Starting MLflow's scoring server for %s on %s: %s", model.uri, url, shlex.join(argv))
    # Its logs (uvicorn's access log writes to stdout) go to stderr: stdout is the banner's.
    process = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=_stderr_fd(),
        process_group=0,
        preexec_fn=die_with_parent(signal.SIGTERM),  # uvicorn stops its workers on SIGTERM
    )
    try:
        _wait_until_ready(process, url)
        sys.stdout.write(banner(model, usage, url))
        sys.stdout.flush()
        code = process.wait()
    except Stopped as stopped:
        with ignoring_stop_signals():
            stopped_workers = stop_tree(
                ManagedProcess.started(process), "scoring server", STOP_GRACE_SECONDS
            )
        log.info(
            "Stopped by %s: the scoring server (pid %d) and its %d child process(es) ended.",
            stopped,
            process.pid,
            stopped_workers,
        )
        return 128 + stopped.signum
    except BaseException:
        with ignoring_stop_signals():
            stop_tree(ManagedProcess.started(process), "scoring server", STOP_GRACE_SECONDS)
        raise
    raise ServingError(f"the scoring server ended by itself (exit code {code}); its log is above")


def port_problem(port: int) -> str | None:
    """Why the scoring server could not listen on `port` of 127.0.0.1, or None."""
    if port == 0:
        return None
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((HOST, port))
        except OSError as error:
            return (
                f"port {port} on {HOST} is in use ({error.strerror}); pick another with "
                "--port N, or --port 0 for a free one"
            )
    return None


def _wait_until_ready(process: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServingError(
                f"the scoring server exited with code {process.returncode} before it answered; "
                "its log is above"
            )
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            urllib.request.urlopen(f"{url}/ping", timeout=2) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.5)
    raise ServingError(f"the scoring server did not answer {url}/ping in {READY_TIMEOUT_SECONDS} s")


def banner(model: ModelVersionToServe, usage: Usage, url: str) -> str:
    """What `serve-model` prints once the model answers: where, what it takes, an example."""
    if usage.example is not None:
        body = shlex.quote(usage.example)
    elif usage.example_file is not None:
        body = "@" + shlex.quote(str(usage.example_file))
    else:
        body = shlex.quote('{"' + usage.input_format + '": ...}')
    answer = ", ".join(f'"{column}": …' for column in usage.answer_columns) or "…"
    lines = [
        f"Serving {model.registered_model} version {model.version} (alias {model.alias}) of "
        f"pipeline {model.pipeline} at {url}",
        f"  listening on {HOST} only, with no authentication of its own: to share it, put your "
        "own authenticating proxy in front",
        f"  it takes {usage.input_description}",
        f'  it answers {{"predictions": [{{{answer}}}, …]}}, one per example',
        "Try it:",
        f"  curl -s {url}/invocations -H 'Content-Type: application/json' -d {body}",
        "Stop it with Ctrl-C.",
        "",
    ]
    return "\n".join(lines)


def _stderr_fd() -> int | None:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stream (tests): inherit
        return None
