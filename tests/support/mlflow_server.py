"""A real `mlflow server` on 127.0.0.1 and a free port, for the tests that need one of their own."""

from __future__ import annotations

import os
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.processes import running

SERVER_START_SECONDS = 180


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def mlflow_server(folder: Path) -> Iterator[str]:
    """`mlflow server` with a SQLite store and proxied artifacts in `folder`; yields its URL.

    The server's log is `folder/server.log`; the server is stopped on leaving.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",  # ~400 MB instead of ~1.5 GB
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
    }
    log_path = folder / "server.log"
    command = [
        str(Path(sys.executable).with_name("mlflow")),
        "server",
        "--backend-store-uri",
        f"sqlite:///{folder / 'mlflow.db'}",
        "--artifacts-destination",
        str(folder / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    with running(command, env, log_path) as server:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while True:
            assert server.poll() is None, log_path.read_text()[-3000:]
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "mlflow server did not come up"
                time.sleep(0.5)
        yield url
