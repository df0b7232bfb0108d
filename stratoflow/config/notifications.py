"""Who hears about a retrain run, and through which of the deployment's mail connections.

The deployment decides, once for all its pipelines, through the environment of the processes
that run tasks (the scheduler's task processes, `airflow dags test`):

- `STRATOFLOW_NOTIFY_EMAIL`: the addresses that get a mail, comma-separated; unset or empty:
  no mail is sent (and no SMTP server is needed);
- `STRATOFLOW_NOTIFY_SMTP_CONN_ID`: the Airflow connection of the SMTP server (default
  `smtp_default`), with the sender in its `from_email` extra, e.g.
  `AIRFLOW_CONN_SMTP_DEFAULT='smtp://mail.example.org:587?from_email=airflow%40example.org'`.

Not a `pipeline.yaml` field: addresses are the deployment's, like its clusters; a pipeline
author (or a trigger) cannot send the deployment's mail elsewhere. Read when a callback runs,
never at DAG parse time.
"""

from __future__ import annotations

import os

NOTIFY_EMAIL_ENV = "STRATOFLOW_NOTIFY_EMAIL"
SMTP_CONN_ID_ENV = "STRATOFLOW_NOTIFY_SMTP_CONN_ID"
DEFAULT_SMTP_CONN_ID = "smtp_default"


def email_recipients() -> list[str]:
    """The deployment's notification addresses, in order, without repeats; empty: none.

    Raises:
        ValueError: an entry that is not an address (names the variable and the entry).
    """
    found: list[str] = []
    for entry in os.environ.get(NOTIFY_EMAIL_ENV, "").split(","):
        address = entry.strip()
        if not address:
            continue
        if "@" not in address or any(c.isspace() for c in address):
            raise ValueError(f"${NOTIFY_EMAIL_ENV}: {address!r:.80} is not an email address")
        if address not in found:
            found.append(address)
    return found


def smtp_conn_id() -> str:
    """The Airflow connection id of the SMTP server notifications go through."""
    return os.environ.get(SMTP_CONN_ID_ENV, "").strip() or DEFAULT_SMTP_CONN_ID
