"""When `ray_launcher.connect` tries a second time, and when it gives up at once.

The failure the retry is for, Ray's client proxier losing the server process it starts for a
driver (seen once in CI, a race inside Ray), cannot be provoked on purpose, so `ray.init` is
replaced here by one that fails as told: a test double for Ray's side only. The real connections
(through Ray Client and to the GCS, token refused) are in tests/integration/test_ray_hosts.py.
"""

from __future__ import annotations

import logging

import pytest
import ray

from stratoflow.distributed import ray_launcher


class FailingInit:
    """Stands in for `ray.init`: raises the given errors in turn, then connects."""

    def __init__(self, *errors: Exception):
        self.errors = list(errors)
        self.addresses: list[str] = []

    def __call__(self, address: str, **_: object) -> None:
        self.addresses.append(address)
        if self.errors:
            raise self.errors.pop(0)


@pytest.fixture
def init(monkeypatch: pytest.MonkeyPatch):
    def use(*errors: Exception) -> FailingInit:
        fake = FailingInit(*errors)
        monkeypatch.setattr(ray, "init", fake)
        monkeypatch.setattr(ray, "is_initialized", lambda: False)
        monkeypatch.setattr(ray_launcher, "RAY_CLIENT_RETRY_PAUSE_SECONDS", 0.0)
        return fake

    return use


def test_a_ray_client_server_lost_at_start_up_is_tried_once_more(init, caplog):
    fake = init(ConnectionError("Failed during this or a previous request"))
    with caplog.at_level(logging.WARNING, logger=ray_launcher.__name__):
        ray_launcher.connect("ray://head:10001")
    assert fake.addresses == ["ray://head:10001"] * 2
    assert "trying again" in caplog.text


def test_a_second_failure_names_the_address_and_the_error(init):
    fake = init(ConnectionError("first"), ConnectionError("second"))
    with pytest.raises(ray_launcher.RayClusterError, match=r"'ray://head:10001'.*second"):
        ray_launcher.connect("ray://head:10001")
    assert len(fake.addresses) == 2


def test_nothing_answering_is_not_waited_for_twice(init):
    fake = init(ConnectionError("ray client connection timeout"))
    with pytest.raises(ray_launcher.RayClusterError, match="connection timeout"):
        ray_launcher.connect("ray://head:10001")
    assert len(fake.addresses) == 1


def test_a_gcs_address_gets_one_attempt(init):
    fake = init(ConnectionError("refused"))
    with pytest.raises(ray_launcher.RayClusterError, match="'head:6379'"):
        ray_launcher.connect("head:6379")
    assert len(fake.addresses) == 1
