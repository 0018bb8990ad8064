"""What the cold-path HTTP client (``speedmatrix.http``) keeps without httpx: the bounds
(body size, header count and line, keep-alive), the request's ``Budget`` (deadline and bytes
read), and the one-line ``ConnectError`` for each exception of httpx, httpcore or the
network, read by its kind's name. The httpx side (the pool, proxies, reading a body under
the bounds) is ``speedmatrix.httppool``, imported on the first request so that
``speedmatrix --help`` does not pay for httpx."""

from __future__ import annotations

import socket
import ssl
import threading
import time

from speedmatrix.errors import SpeedmatrixError
from speedmatrix.httperrors import ConnectError

#: the largest answer body read (discovery answers are a few KiB; /v1/models of a big
#: registry a few MiB); a larger one is an error, never held in memory
MAX_BODY_BYTES = 16 << 20
#: the most headers an answer may have, and the longest header line (http.client's limits)
MAX_HEADERS = 100
MAX_HEADER_LINE_BYTES = 64 << 10
#: how long an idle connection is kept for the client's next request; below the 5 s after
#: which uvicorn (vLLM, SGLang) closes one, so a request never meets a connection the server
#: is closing at that moment
KEEPALIVE_S = 2.0
#: the most a compressed answer is inflated in one step (memory held at once beyond the body)
INFLATE_STEP = 1 << 20


class Budget(threading.local):
    """The request under way on this thread: its deadline (``time.monotonic()``), the bytes
    of its answer read so far and their first few (to tell "not HTTP" from "no answer")."""

    deadline: float | None = None
    received: int = 0
    head: bytes = b""

    def start(self, timeout_s: float) -> None:
        self.deadline = time.monotonic() + timeout_s
        self.received = 0
        self.head = b""

    def stop(self) -> None:
        self.deadline = None


def connect_error(
    exc: BaseException, url: str, timeout: float, budget: Budget, in_body: bool
) -> SpeedmatrixError:
    """The one-line error for an exception of httpx or httpcore (h11's come wrapped in
    httpcore's RemoteProtocolError), by kind; the network's own (refused, DNS, TLS) by the
    OSError at the root of the chain."""
    if isinstance(exc, SpeedmatrixError):
        return exc
    name = type(exc).__name__  # httpx and httpcore name their kinds alike
    text = str(exc)
    if name in ("ReadTimeout", "TimeoutException") or (name == "WriteTimeout" and in_body):
        if in_body:
            return ConnectError(url, f"the answer did not end within {timeout:g} s")
        return ConnectError(url, f"no answer within {timeout:g} s")
    if name in ("ConnectTimeout", "WriteTimeout", "PoolTimeout"):
        return ConnectError(url, "timed out")
    if name == "RemoteProtocolError":
        if "Receive buffer too long" in text:
            return ConnectError(
                url, "the answer's headers are over 100 KiB (64 KiB a line, 100 KiB in all)"
            )
        if in_body:
            return ConnectError(url, f"the answer broke off ({text[:120]})")
        if budget.received == 0:
            return ConnectError(url, "the server closed the connection without answering")
        if not budget.head.startswith(b"HTTP/"[: len(budget.head)]) or "status line" in text:
            return ConnectError(url, "the answer is not HTTP")
        if "disconnected" in text:
            return ConnectError(url, "the server closed the connection in the answer's headers")
        return ConnectError(url, f"a broken HTTP answer ({text[:120]})")
    if name == "ProxyError":
        return ConnectError(url, f"the proxy refused ({text[:120]})")
    root = _root_cause(exc)
    if in_body and name in ("ReadError", "NetworkError"):
        return ConnectError(url, f"the answer broke off ({_reason(root) if root else text[:120]})")
    if root is not None:
        return ConnectError(url, _reason(root))
    if name in ("ReadError", "WriteError", "NetworkError", "ConnectError"):
        return ConnectError(url, text[:120] or name)
    return ConnectError(url, f"a broken HTTP answer ({text[:120] or name})")


def _root_cause(exc: BaseException) -> OSError | None:
    """The OSError (socket, DNS, TLS) that httpcore and httpx wrapped, if any."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 10:
        if isinstance(cur, OSError):
            return cur
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return None


def _reason(reason: object) -> str:
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return "timed out"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve the host name ({reason.strerror or reason})"
    if isinstance(reason, ssl.SSLCertVerificationError):
        return f"TLS: {reason.verify_message or reason} (--ca-file FILE or --insecure)"
    if isinstance(reason, ssl.SSLError):
        return f"TLS: {reason.reason or reason}"
    if isinstance(reason, (ConnectionResetError, BrokenPipeError)):
        return "the server reset the connection"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower() if reason.strerror else str(reason)
    return str(reason)
