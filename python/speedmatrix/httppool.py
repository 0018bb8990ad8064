"""The httpx side of the cold-path HTTP client (``speedmatrix.http``): httpx's client over
an httpcore pool of our own, whose every socket read is given only the time left of the
request (``_DeadlineStream``) and counted, and proxies as the standard library reads them.
``speedmatrix.http`` imports this module on its first request, so that ``speedmatrix --help``
does not pay for httpx; the bounds and the one-line errors are in ``httptransport``."""

from __future__ import annotations

import ssl
import time
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator
from typing import Any

import httpcore
import httpx

from speedmatrix.httperrors import ConnectError
from speedmatrix.httptransport import (
    INFLATE_STEP,
    KEEPALIVE_S,
    MAX_BODY_BYTES,
    MAX_HEADER_LINE_BYTES,
    MAX_HEADERS,
    Budget,
    connect_error,
)
from speedmatrix.redact import redact

#: what a request can raise besides our own errors: httpx's and httpcore's exceptions (h11's
#: arrive as httpcore's RemoteProtocolError) and the network's OSErrors
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    httpx.HTTPError,
    httpx.StreamError,
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.ProxyError,
    httpcore.UnsupportedProtocol,
    OSError,
)


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
    except TRANSPORT_ERRORS as exc:
        raise connect_error(exc, url, timeout, budget, in_body=True) from None
    return b"".join(parts).decode("utf-8", "replace")


def _inflated(inflate: Any, data: bytes, url: str, encoding: str) -> Iterator[bytes]:
    """``data`` inflated in pieces of at most ``INFLATE_STEP`` bytes (zlib keeps the input
    it has not used yet), so that one compressed chunk never becomes one huge buffer."""
    while data:
        try:
            out = inflate.decompress(data, INFLATE_STEP)
        except zlib.error:
            raise ConnectError(url, f"the answer's {encoding} body is corrupt") from None
        data = inflate.unconsumed_tail
        if not out:
            return
        yield out


def client(base_url: str, ssl_context: ssl.SSLContext | None, budget: Budget) -> httpx.Client:
    """httpx's client over the deadline-keeping pool (redirects are the caller's, proxies
    the environment's as the standard library reads them)."""
    return httpx.Client(
        transport=_Transport(base_url, ssl_context, budget),
        follow_redirects=False,
        trust_env=False,  # proxies: the transport's, from the environment
    )
