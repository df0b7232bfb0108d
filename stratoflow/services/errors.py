"""The one error the services stack raises."""

from __future__ import annotations


class ServiceError(RuntimeError):
    """A component could not start or stop; the message names it and quotes its log."""
