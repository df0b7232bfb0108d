"""A local SMTP server on loopback that keeps every mail it receives (aiosmtpd), for tests of the
notifications: it delivers nothing anywhere."""

from __future__ import annotations

import email
import email.policy
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any


@dataclass
class SmtpSink:
    """The sink's address and the mails it got, in order of arrival."""

    host: str
    port: int
    mails: list[EmailMessage] = field(default_factory=list)
    recipients: list[list[str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        with self.lock:
            self.mails.append(message)  # type: ignore[arg-type]
            self.recipients.append(list(envelope.rcpt_tos))
        return "250 OK"

    def connection_uri(self, sender: str = "stratoflow@localhost") -> str:
        """An Airflow SMTP connection URI to this sink: plain SMTP, no TLS, no login."""
        sender = sender.replace("@", "%40")
        return (
            f"smtp://{self.host}:{self.port}?disable_ssl=true&disable_tls=true"
            f"&from_email={sender}&retry_limit=0&timeout=10"
        )

    @staticmethod
    def text_of(message: EmailMessage) -> str:
        """Subject and every text part of `message`, as one string."""
        parts = [str(message["Subject"])]
        for part in message.walk():
            if part.get_content_maintype() == "text":
                parts.append(str(part.get_content()))
        return "\n".join(parts)


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def smtp_sink() -> Iterator[SmtpSink]:
    """An SMTP sink listening on 127.0.0.1 (a free port) until the block ends."""
    from aiosmtpd.controller import Controller

    sink = SmtpSink("127.0.0.1", free_loopback_port())
    controller = Controller(sink, hostname=sink.host, port=sink.port)
    controller.start()
    try:
        yield sink
    finally:
        controller.stop()


@contextmanager
def deployment_mail_sink(recipient: str) -> Iterator[SmtpSink]:
    """An SMTP sink, and the deployment's notification settings (`STRATOFLOW_NOTIFY_EMAIL`,
    connection `smtp_default`) pointing at it, in this process's environment (Airflow commands
    started meanwhile inherit them) until the block ends."""
    import pytest

    from stratoflow.config import notifications

    with smtp_sink() as sink, pytest.MonkeyPatch.context() as patch:
        patch.setenv(notifications.NOTIFY_EMAIL_ENV, recipient)
        patch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", sink.connection_uri())
        yield sink
