"""A limit on password guessing at Airflow's REST login, `POST /auth/token`.

FAB's auth manager limits its UI login form (`[fab] auth_rate_limit`, every post from one
address) but not the REST API's token endpoints, which answered 30 wrong passwords in a row.
`LoginRateLimit` is an ASGI middleware on the api-server (registered by the Airflow plugin in
`deploy/airflow-plugins/`) that counts the failed sign-ins (HTTP 401) there, by client address:

- `FAILURES_PER_LOGIN` for one username from one address: past it, that username is refused
  from that address with 429 (and a Retry-After), the right password too, until the oldest
  failure leaves the window; others, and the same user elsewhere, still sign in;
- `FAILURES_PER_ADDRESS` whatever the usernames (one password tried on many accounts): past it,
  every sign-in from that address is refused.

A successful sign-in clears that login's count. The counts live in the api-server process's
memory: each api-server worker counts its own, and a restart forgets them. Requests from one
address are handled one at a time, so parallel guesses cannot slip past the count. Behind a
reverse proxy every client has the proxy's address: limit there too, or have the api-server
trust the proxy's forwarded address.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

log = logging.getLogger(__name__)

LIMITED_PATHS = frozenset({"/auth/token", "/auth/token/cli"})
# `limits` notation: failed sign-ins per moving window.
FAILURES_PER_LOGIN = "5/minute"
FAILURES_PER_ADDRESS = "20/minute"
# A sign-in body is a few hundred bytes; anything far larger is refused unread.
MAX_BODY_BYTES = 64 * 1024

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


class LoginRateLimit:
    """ASGI middleware: 429 for a login or an address with too many recent failed sign-ins.

    Args:
        app: the application it wraps (Airflow's root FastAPI app).
        per_login: failed sign-ins allowed for one username from one address, e.g. "5/minute".
        per_address: failed sign-ins allowed from one address, whatever the usernames.
        storage_uri: where the counts live (`limits` storage: "memory://", "redis://...").
    """

    def __init__(
        self,
        app: Asgi,
        per_login: str = FAILURES_PER_LOGIN,
        per_address: str = FAILURES_PER_ADDRESS,
        storage_uri: str = "memory://",
    ):
        from limits import parse, storage, strategies

        self.app = app
        self._per_login = parse(per_login)
        self._per_address = parse(per_address)
        self._counts = strategies.MovingWindowRateLimiter(storage.storage_from_string(storage_uri))
        # address -> [its lock, how many requests hold or wait for it]
        self._locks: dict[str, list[Any]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _is_sign_in(scope):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:  # the client went away
            return
        if len(body) > MAX_BODY_BYTES:
            await _respond(send, 413, "the sign-in request is too large")
            return
        address = (scope.get("client") or ("unknown",))[0]
        username = _username(body)
        async with self._one_at_a_time(address):
            wait = self._refusal(address, username)
            if wait is not None:
                # Not the username: people type their password there by mistake.
                log.warning("a sign-in from %s got 429: too many failed sign-ins", address)
                await _respond(
                    send,
                    429,
                    f"too many failed sign-ins; try again in {wait} s",
                    {"retry-after": str(wait)},
                )
                return
            status = await self._forward(scope, body, receive, send)
            if status == 401:
                self._counts.hit(self._per_login, address, username)
                self._counts.hit(self._per_address, address)
            elif 200 <= status < 300:
                self._counts.clear(self._per_login, address, username)

    def _refusal(self, address: str, username: str) -> int | None:
        """Seconds until `username` may sign in from `address` again, or None if it may now."""
        for item, keys in (
            (self._per_address, (address,)),
            (self._per_login, (address, username)),
        ):
            if not self._counts.test(item, *keys):
                reset = self._counts.get_window_stats(item, *keys).reset_time
                return max(1, math.ceil(reset - time.time()))
        return None

    async def _forward(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> int:
        """Pass the request, its body already read, to the app; the answer's status."""
        status = 0
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # e.g. http.disconnect

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        await self.app(scope, replay, watch)
        return status

    @contextlib.asynccontextmanager
    async def _one_at_a_time(self, address: str) -> AsyncIterator[None]:
        entry = self._locks.setdefault(address, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if not entry[1]:
                del self._locks[address]


def _is_sign_in(scope: Scope) -> bool:
    if scope["type"] != "http" or scope.get("method") != "POST":
        return False
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path.rstrip("/") in LIMITED_PATHS


async def _read_body(receive: Receive) -> bytes | None:
    """The request body, or None if the client disconnected; stops past `MAX_BODY_BYTES`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY_BYTES or not message.get("more_body"):
            return b"".join(chunks)


def _username(body: bytes) -> str:
    """The username a sign-in names, case-folded ("" if none: such bodies share one count)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    username = data.get("username") if isinstance(data, dict) else None
    return username[:256].casefold() if isinstance(username, str) else ""


async def _respond(
    send: Send, status: int, detail: str, headers: dict[str, str] | None = None
) -> None:
    body = json.dumps({"detail": detail}).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((name.encode(), value.encode()) for name, value in (headers or {}).items()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})
