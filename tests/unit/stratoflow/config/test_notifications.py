"""The deployment's notification settings: who gets mail, through which connection."""

from __future__ import annotations

import pytest

from stratoflow.config import notifications


def test_no_recipients_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(notifications.NOTIFY_EMAIL_ENV, raising=False)
    assert notifications.email_recipients() == []
    monkeypatch.setenv(notifications.NOTIFY_EMAIL_ENV, " , ")
    assert notifications.email_recipients() == []


def test_recipients_are_read_in_order_without_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(notifications.NOTIFY_EMAIL_ENV, "a@example.org, b@example.org,a@example.org")
    assert notifications.email_recipients() == ["a@example.org", "b@example.org"]


def test_an_entry_that_is_no_address_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(notifications.NOTIFY_EMAIL_ENV, "a@example.org,ops team")
    with pytest.raises(ValueError, match=r"STRATOFLOW_NOTIFY_EMAIL: 'ops team' is not an email"):
        notifications.email_recipients()


def test_the_smtp_connection_defaults_to_smtp_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(notifications.SMTP_CONN_ID_ENV, raising=False)
    assert notifications.smtp_conn_id() == "smtp_default"
    monkeypatch.setenv(notifications.SMTP_CONN_ID_ENV, "smtp_ops")
    assert notifications.smtp_conn_id() == "smtp_ops"
