"""The transport under the cold-path HTTP client (``speedmatrix.http``): httpx's client over an
httpcore pool of our own, whose every socket read is given only the time left of the request
(``_DeadlineStream``) and counted; proxies as the standard library reads them; the header and
body bounds httpx does not set (inflating under a cap); and the one-line ``ConnectError`` for
each exception of httpx, httpcore or the network.

httpx and httpcore are imported on the first request (not at module level) so that
``speedmatrix --help`` does not pay for them."""

from __future__ import annotations

import functools
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from speedmatrix.errors import SpeedmatrixError
from speedmatrix.httperrors import ConnectError
from speedmatrix.redact import redact

if TYPE_CHECKING:
    import httpx

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
_INFLATE_STEP = 1 << 20


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


class _DeadlineStream:
    """An httpcore network stream whose reads never outlast the request's deadline (each gets
    at most the time left) and are counted."""

    def __init__(self, inner: Any, budget: Budget) -> None:
        self._inner = inner
        self._budget = budget

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        budget = self._budget
        if budget.deadline is not None:
            left = budget.deadline - time.monotonic()
            if left <= 0:
                import httpcore

                raise httpcore.ReadTimeout("the request's time is up")
            timeout = left if timeout is None else min(timeout, left)
        data = self._inner.read(max_bytes, timeout)
        if len(budget.head) < 8:
            budget.head += data[: 8 - len(budget.head)]
        budget.received += len(data)
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> _DeadlineStream:
        return _DeadlineStream(
            self._inner.start_tls(ssl_context, server_hostname, timeout), self._budget
        )

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend:
    """httpcore's own socket backend, its streams wrapped in _DeadlineStream."""

    def __init__(self, budget: Budget) -> None:
        import httpcore

        self._inner = httpcore.SyncBackend()
        self._budget = budget

    def connect_tcp(self, *args: Any, **kw: Any) -> _DeadlineStream:
        return _DeadlineStream(self._inner.connect_tcp(*args, **kw), self._budget)

    def connect_unix_socket(self, *args: Any, **kw: Any) -> _DeadlineStream:
        return _DeadlineStream(self._inner.connect_unix_socket(*args, **kw), self._budget)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _proxy(base_url: str) -> Any:
    """The environment's proxy for ``base_url`` as the standard library reads it (urllib's
    ``getproxies``/``proxy_bypass``: ``http_proxy``, ``https_proxy``, ``no_proxy``), or None."""
    import httpcore

    p = urllib.parse.urlsplit(base_url)
    proxy = urllib.request.getproxies().get(p.scheme)
    if not proxy or urllib.request.proxy_bypass(p.hostname or ""):
        return None
    q = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
    if q.scheme not in ("http", "https") or not q.hostname:
        raise ConnectError(base_url, f"the {p.scheme}_proxy {redact(proxy)!r} is not http(s)")
    auth = None
    if q.username is not None:
        user, pw = urllib.parse.unquote(q.username), urllib.parse.unquote(q.password or "")
        auth = (user, pw)
    host = f"[{q.hostname}]" if ":" in q.hostname else q.hostname
    url = f"{q.scheme}://{host}" + (f":{q.port}" if q.port else "")
    return httpcore.Proxy(url, auth=auth)


def transport(base_url: str, ssl_context: ssl.SSLContext | None, budget: Budget) -> Any:
    return _transport_class()(base_url, ssl_context, budget)


@functools.cache
def _transport_class() -> type:
    """httpx's transport interface over an httpcore pool of our own (httpx's HTTPTransport
    does not take a network backend). httpcore's exceptions pass through unchanged;
    ``connect_error`` reads them."""
    import httpcore
    import httpx

    class _Body(httpx.SyncByteStream):
        def __init__(self, stream: Any) -> None:
            self._stream = stream

        def __iter__(self) -> Iterator[bytes]:
            yield from self._stream

        def close(self) -> None:
            if hasattr(self._stream, "close"):
                self._stream.close()

    class _Transport(httpx.BaseTransport):
        def __init__(self, base_url: str, ssl_context: ssl.SSLContext | None, budget: Budget):
            self._pool = httpcore.ConnectionPool(
                ssl_context=ssl_context,
                proxy=_proxy(base_url),
                max_connections=8,
                max_keepalive_connections=2,
                keepalive_expiry=KEEPALIVE_S,
                network_backend=_DeadlineBackend(budget),  # type: ignore[arg-type]
            )

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            req = httpcore.Request(
                method=request.method,
                url=httpcore.URL(
                    scheme=request.url.raw_scheme,
                    host=request.url.raw_host,
                    port=request.url.port,
                    target=request.url.raw_path,
                ),
                headers=request.headers.raw,
                content=request.stream,
                extensions=request.extensions,
            )
            resp = self._pool.handle_request(req)
            return httpx.Response(
                status_code=resp.status,
                headers=resp.headers,
                stream=_Body(resp.stream),
                extensions=resp.extensions,
            )

        def close(self) -> None:
            self._pool.close()

    return _Transport


def check_headers(resp: httpx.Response, url: str) -> None:
    """http.client's limits, which h11 (100 KiB in all) does not set: 100 headers, 64 KiB a
    line."""
    raw = resp.headers.raw
    if len(raw) > MAX_HEADERS:
        raise ConnectError(
            url, f"a broken HTTP answer (more than {MAX_HEADERS} headers: {len(raw)})"
        )
    if any(len(k) + len(v) + 2 > MAX_HEADER_LINE_BYTES for k, v in raw):
        raise ConnectError(url, "the answer has a header line over 64 KiB")


def read_body(
    resp: httpx.Response, url: str, budget: Budget, timeout: float, limit: int = MAX_BODY_BYTES
) -> str:
    """The body as text, at most ``limit`` bytes (decompressed, when the server compressed it
    although asked not to) and within the request's deadline; otherwise a ConnectError.

    Read raw (``iter_raw``) and inflated here with the output of each step capped at what the
    limit leaves: httpx's own decoders inflate a whole chunk at once, so 64 KiB of a gzip bomb
    would become 64 MiB in memory before any check."""
    encoding = (resp.headers.get("Content-Encoding") or "").strip().lower()
    inflate = None
    if encoding in ("gzip", "x-gzip", "deflate"):
        inflate = zlib.decompressobj(47 if encoding != "deflate" else 15 + 32)
    elif encoding not in ("", "identity"):
        raise ConnectError(url, f"the answer is encoded as {encoding!r}, which is not supported")
    length = resp.headers.get("Content-Length")
    if length and length.strip().isdigit() and int(length) > limit and inflate is None:
        raise ConnectError(url, f"the answer is {int(length):,} bytes, over the {limit:,} read")
    parts: list[bytes] = []
    size = 0
    try:
        for raw in resp.iter_raw():
            for chunk in [raw] if inflate is None else _inflated(inflate, raw, url, encoding):
                size += len(chunk)
                if size > limit:
                    raise ConnectError(url, f"the answer is over {limit:,} bytes; not read further")
                parts.append(chunk)
            if budget.deadline is not None and time.monotonic() > budget.deadline:
                raise ConnectError(url, f"the answer did not end within {timeout:g} s")
        if inflate is not None:
            parts.append(inflate.flush())  # what zlib still holds: at most its 32 KiB window
            if size + len(parts[-1]) > limit:
                raise ConnectError(url, f"the answer is over {limit:,} bytes; not read further")
    except transport_errors() as exc:
        raise connect_error(exc, url, timeout, budget, in_body=True) from None
    return b"".join(parts).decode("utf-8", "replace")


def _inflated(inflate: Any, data: bytes, url: str, encoding: str) -> Iterator[bytes]:
    """``data`` inflated in pieces of at most ``_INFLATE_STEP`` bytes (zlib keeps the input
    it has not used yet), so that one compressed chunk never becomes one huge buffer."""
    while data:
        try:
            out = inflate.decompress(data, _INFLATE_STEP)
        except zlib.error:
            raise ConnectError(url, f"the answer's {encoding} body is corrupt") from None
        data = inflate.unconsumed_tail
        if not out:
            return
        yield out


@functools.cache
def transport_errors() -> tuple[type[BaseException], ...]:
    """What a request can raise besides our own errors: httpx's and httpcore's exceptions
    (h11's arrive as httpcore's RemoteProtocolError) and the network's OSErrors."""
    import httpcore
    import httpx

    return (
        httpx.HTTPError,
        httpx.StreamError,
        httpcore.TimeoutException,
        httpcore.NetworkError,
        httpcore.ProtocolError,
        httpcore.ProxyError,
        httpcore.UnsupportedProtocol,
        OSError,
    )


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
