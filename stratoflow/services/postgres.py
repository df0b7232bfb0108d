"""A private PostgreSQL cluster run with the server's own programs: initdb, roles, pg_ctl.

Debian keeps the server programs off the PATH, and PostgreSQL refuses to run as root, so this
module finds the programs and, when run as root, runs them as the `postgres` OS user.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stratoflow.services.errors import ServiceError
from stratoflow.services.state_files import last_lines, write_private_text

log = logging.getLogger(__name__)

OS_USER = "postgres"  # initdb and postgres refuse to run as root
SUPERUSER = "stratoflow"
# The server's own environment: messages and times that read the same on every host.
SERVER_ENVIRONMENT = {"LC_ALL": "C.UTF-8", "TZ": "UTC"}


def postgres_bin(program: str) -> Path:
    """The path of a PostgreSQL server program (`initdb`, `postgres`, `pg_isready`, ...).

    Looks in `$STRATOFLOW_PG_BIN`, then next to `initdb` on the PATH, then in the newest
    `/usr/lib/postgresql/<version>/bin` (Debian puts the server programs there, off the PATH).

    Raises:
        ServiceError: PostgreSQL's server programs are not installed.
    """
    candidates = []
    if os.environ.get("STRATOFLOW_PG_BIN"):
        candidates.append(Path(os.environ["STRATOFLOW_PG_BIN"]))
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(debian)
    for directory in candidates:
        if (directory / program).is_file():
            return directory / program
    raise ServiceError(
        f"PostgreSQL's {program} was not found (looked in $STRATOFLOW_PG_BIN, the PATH and "
        "/usr/lib/postgresql/*/bin); install the server, e.g. `apt-get install postgresql`"
    )


def is_initialised(cluster_dir: Path) -> bool:
    """Whether `initdb` has already created the cluster in `cluster_dir`."""
    return (cluster_dir / "data" / "PG_VERSION").is_file()


# A scheduler killed mid-transaction (OOM, kill -9) leaves its LocalExecutor workers running,
# and they hold its connection open: the transaction and its row locks on `dag_run` would stay
# forever, and the next scheduler (SELECT ... FOR UPDATE SKIP LOCKED) would skip those runs
# without a word. The server ends such a transaction after this long; no stratoflow or Airflow
# transaction waits on its client that long.
IDLE_IN_TRANSACTION_TIMEOUT = "60s"


def server_command(cluster_dir: Path, host: str, port: int) -> list[str]:
    """The `postgres` command line: TCP on `host` only, no Unix socket; transactions left open
    by a dead client end after `IDLE_IN_TRANSACTION_TIMEOUT`."""
    return [
        str(postgres_bin("postgres")),
        "-D",
        str(cluster_dir / "data"),
        "-p",
        str(port),
        "-c",
        f"listen_addresses={host}",
        "-c",
        "unix_socket_directories=",
        "-c",
        f"idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT}",
    ]


def as_server_user() -> dict[str, Any]:
    """`subprocess` arguments that run a PostgreSQL program as it must run: not as root."""
    return _os_user() if os.geteuid() == 0 else {}


def initdb(cluster_dir: Path, superuser_password: str) -> None:
    """Create a cluster in `cluster_dir/data`, its superuser `SUPERUSER` with that password.

    Raises:
        ServiceError: initdb failed (its last lines are quoted), or the `postgres` OS user
            cannot reach `cluster_dir`.
    """
    cluster_dir.mkdir(parents=True, exist_ok=True)
    password_file = cluster_dir / "superuser-password"
    write_private_text(password_file, superuser_password + "\n")
    user = as_server_user()
    if user:
        _check_reachable_by_os_user(cluster_dir)
        for path in (cluster_dir, password_file):
            shutil.chown(path, OS_USER, OS_USER)
    cluster_dir.chmod(0o700)  # its owner's only: the postgres OS user's, when root
    try:
        result = subprocess.run(
            [
                str(postgres_bin("initdb")),
                "-D",
                str(cluster_dir / "data"),
                "-U",
                SUPERUSER,
                f"--pwfile={password_file}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
            ],
            capture_output=True,
            text=True,
            cwd=str(cluster_dir),
            env={**os.environ, **SERVER_ENVIRONMENT},
            check=False,
            **user,
        )
    finally:
        password_file.unlink(missing_ok=True)
    if result.returncode:
        raise ServiceError(f"initdb failed:\n{last_lines(result.stdout + result.stderr)}")


def create_databases(
    host: str, port: int, superuser_password: str, owners: Mapping[str, tuple[str, str]]
) -> None:
    """Create each database and its owning role, or reset the role's password if both exist.

    Args:
        owners: database -> (owning role, that role's password).
    """
    import psycopg2
    from psycopg2 import sql

    connection = psycopg2.connect(
        host=host, port=port, user=SUPERUSER, password=superuser_password, dbname="postgres"
    )
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            for database, (role, password) in owners.items():
                cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
                verb = "ALTER" if cursor.fetchone() else "CREATE"
                cursor.execute(
                    sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(
                        sql.Identifier(role), sql.Literal(password)
                    )
                )
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
                if cursor.fetchone() is None:
                    cursor.execute(
                        sql.SQL("CREATE DATABASE {} OWNER {}").format(
                            sql.Identifier(database), sql.Identifier(role)
                        )
                    )
    finally:
        connection.close()


def readiness_problem(host: str, port: int) -> str | None:
    """Why the server at host:port does not accept connections yet (`pg_isready`), or None."""
    result = subprocess.run(
        [str(postgres_bin("pg_isready")), "-h", host, "-p", str(port)],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if result.returncode == 0 else (result.stdout + result.stderr).strip()


def fast_stop(cluster_dir: Path, timeout_seconds: float) -> None:
    """`pg_ctl stop -m fast`: roll back open transactions, close connections, shut down."""
    result = subprocess.run(
        [
            str(postgres_bin("pg_ctl")),
            "stop",
            "-D",
            str(cluster_dir / "data"),
            "-m",
            "fast",
            "-t",
            str(int(timeout_seconds)),
        ],
        capture_output=True,
        text=True,
        cwd=str(cluster_dir),
        check=False,
        **as_server_user(),
    )
    if result.returncode:
        log.warning("pg_ctl stop: %s", (result.stdout + result.stderr).strip())


def _os_user() -> dict[str, Any]:
    import pwd

    try:
        entry = pwd.getpwnam(OS_USER)
    except KeyError:
        raise ServiceError(
            "PostgreSQL refuses to run as root and there is no `postgres` OS user to run it "
            "as; install the postgresql package (it creates one) or run as a normal user"
        ) from None
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _check_reachable_by_os_user(folder: Path) -> None:
    result = subprocess.run(["test", "-x", str(folder)], check=False, **_os_user())
    if result.returncode:
        raise ServiceError(
            f"the postgres OS user cannot reach {folder}: every folder above it needs o+x "
            "(or choose a state folder elsewhere, e.g. under /tmp or /srv)"
        )
