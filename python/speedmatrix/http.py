"""The JSON-over-HTTP client for the cold path: discovery, tokenize, calibration.

Built on httpx (its httpcore/h11 HTTP/1.1 engine), imported on the first request so that
``speedmatrix --help`` does not pay for it. Errors say what went wrong in one line. It is
never used to measure anything: cells are run by the C++ core.

Hostile answers are bounded: a body larger than ``MAX_BODY_BYTES`` (after decompression: the
body is inflated here, chunk by chunk, with the output capped, never by httpx's unbounded
decoder) or one that takes longer than the request's timeout to arrive is an error; so are
headers over 100 KiB in all (h11's buffer bound as httpcore sets it), a header line over
64 KiB or more than 100 headers (http.client's limits, kept), and bytes that are not HTTP at
all. The timeout bounds connecting and each read, and the whole request: every socket read is
given only the time left (``_DeadlineStream``), so headers or a body that trickle in cannot
hold a request past it. Redirects are not followed (``Authorization`` must never travel to
another origin; an LLM API that redirects is misconfigured): the error names the new location
so the user can pass it as ``--url``. A 429 with ``Retry-After`` is retried after the wait it
asks for when that wait is at most ``MAX_RETRY_AFTER_S``. Every error message is redacted,
and the client's own key is replaced wherever the server echoed it.

Connections are kept alive for ``KEEPALIVE_S`` between the requests of one client (discovery
makes about ten in a row).

How to reach the server is one :class:`ClientConfig` (API key, ``user:password@`` of the
URL as Basic auth, ``--ca-file`` or else ``SSL_CERT_FILE``, ``--insecure``, the timeout), made
once from the flags and the environment and handed to discovery, the prompt builder and the
C++ core's cells alike (``ClientConfig.apply``): a server that passes discovery is reached
the same way by every stream. There is no module state. Verification uses the standard
library's default context (the system's CAs, or the CA file), not httpx's certifi bundle;
libcurl in the core does not read ``SSL_CERT_FILE`` itself, so the config passes it on. Proxies come from the environment (``http_proxy``,
``https_proxy``, ``no_proxy``) as the standard library reads them, as before.

Over 500 lines: the bounds httpx does not give (one deadline for the whole request, inflating
under a cap, header-line and header-count limits, proxies and TLS as the standard library
reads them) are kept here beside the client they guard, each with the test that holds it.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import os
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from speedmatrix.errors import SpeedmatrixError, TargetError
from speedmatrix.redact import redact, redact_known

if TYPE_CHECKING:
    import httpx

__all__ = [
    "AuthError",
    "ClientConfig",
    "ConnectError",
    "HttpClient",
    "HttpError",
    "UrlError",
    "error_message",
]

#: the largest answer body read (discovery answers are a few KiB; /v1/models of a big
#: registry a few MiB); a larger one is an error, never held in memory
MAX_BODY_BYTES = 16 << 20
#: the longest Retry-After honoured on a 429; a longer one is reported, not waited for
MAX_RETRY_AFTER_S = 10.0
#: how many 429s one request retries before it reports the last
MAX_429_RETRIES = 3
#: the most headers an answer may have, and the longest header line (http.client's limits)
MAX_HEADERS = 100
MAX_HEADER_LINE_BYTES = 64 << 10
#: how long an idle connection is kept for the client's next request; below the 5 s after
#: which uvicorn (vLLM, SGLang) closes one, so a request never meets a connection the server
#: is closing at that moment
KEEPALIVE_S = 2.0
#: the most a compressed answer is inflated in one step (memory held at once beyond the body)
_INFLATE_STEP = 1 << 20


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """How every request of a run reaches the server: discovery, tokenize and calibration
    (:class:`HttpClient`) and the core's streams and metrics reads (:meth:`apply`).

    Made once (:meth:`make`) from the flags and the environment. The credentials (API key,
    Basic auth) are not in repr() and not in :meth:`describe`; :attr:`secrets` lists what
    must be redacted wherever a server might echo it.
    """

    api_key: str | None = dataclasses.field(default=None, repr=False)
    #: (user, password) from the URL's ``user:password@``, sent as Basic auth
    basic_auth: tuple[str, str] | None = dataclasses.field(default=None, repr=False)
    #: the PEM CA bundle to verify with: ``--ca-file``, else ``SSL_CERT_FILE``; None: system's
    ca_file: str | None = None
    #: where ca_file came from ("--ca-file" or "SSL_CERT_FILE"), for messages
    ca_source: str | None = None
    insecure: bool = False
    timeout_s: float = 10.0

    @classmethod
    def make(
        cls,
        url: str | None = None,
        api_key: str | None = None,
        *,
        ca_file: str | os.PathLike | None = None,
        insecure: bool = False,
        timeout_s: float = 10.0,
        environ: Any = None,
    ) -> ClientConfig:
        """The config of ``url``'s credentials, the key, ``ca_file`` (else the environment's
        ``SSL_CERT_FILE`` when it names a file) and ``insecure``."""
        env = os.environ if environ is None else environ
        source = "--ca-file" if ca_file else None
        if not ca_file and env.get("SSL_CERT_FILE") and os.path.isfile(env["SSL_CERT_FILE"]):
            ca_file, source = env["SSL_CERT_FILE"], "SSL_CERT_FILE"
        return cls(
            api_key=api_key or None,
            basic_auth=url_credentials(url) if url else None,
            ca_file=os.fspath(ca_file) if ca_file else None,
            ca_source=source,
            insecure=bool(insecure),
            timeout_s=float(timeout_s),
        )

    def replace(self, **changes: Any) -> ClientConfig:
        return dataclasses.replace(self, **changes)

    @property
    def authorization(self) -> str | None:
        """The ``Authorization`` header's value: the key as Bearer, else Basic, else None."""
        if self.api_key:
            return f"Bearer {self.api_key}"
        if self.basic_auth:
            pair = f"{self.basic_auth[0]}:{self.basic_auth[1]}".encode()
            return "Basic " + base64.b64encode(pair).decode()
        return None

    @property
    def secrets(self) -> list[str]:
        """Every credential as it could be echoed: the key, the password, the Basic token."""
        out = [self.api_key] if self.api_key else []
        if self.basic_auth and self.basic_auth[1]:
            out.append(self.basic_auth[1])
            out.append(str(self.authorization).removeprefix("Basic "))
        return out

    def describe(self) -> dict[str, Any]:
        """How https was verified, for run.json: no path beyond the file's name, no secret."""
        return {
            "insecure": self.insecure,
            "ca_file": os.path.basename(self.ca_file) if self.ca_file else None,
            "ca_source": self.ca_source,
        }

    def ssl_context(self) -> ssl.SSLContext:
        if self.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        # SSL_CERT_FILE is read by OpenSSL's default paths itself, beside the default CA
        # directory, as before; only --ca-file replaces the system's CAs
        cafile = self.ca_file if self.ca_source != "SSL_CERT_FILE" else None
        try:
            return ssl.create_default_context(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            raise SpeedmatrixError(
                f"{self.ca_source or '--ca-file'} {self.ca_file}: cannot load it ({exc})"
            ) from None

    def client(self, base_url: str, timeout_s: float | None = None) -> HttpClient:
        """An HttpClient for ``base_url`` with this config (``timeout_s``: another bound)."""
        return HttpClient(
            base_url, config=self if timeout_s is None else self.replace(timeout_s=float(timeout_s))
        )

    def apply(self, spec: Any) -> None:
        """Sets a core CellSpec's credentials and TLS choice to this config's: the key, Basic
        auth as a header, certificate verification and the CA file."""
        if self.api_key:
            spec.api_key = self.api_key
        elif self.basic_auth:
            spec.headers = [*spec.headers, f"Authorization: {self.authorization}"]
        spec.tls_verify = not self.insecure
        if self.ca_file:
            spec.ca_file = self.ca_file


def url_credentials(url: str) -> tuple[str, str] | None:
    """The (user, password) of a URL's ``user:password@``, percent-decoded; None without."""
    try:
        parsed = urllib.parse.urlsplit(url)
    except ValueError:
        return None
    if parsed.username is None and parsed.password is None:
        return None
    return urllib.parse.unquote(parsed.username or ""), urllib.parse.unquote(parsed.password or "")


class UrlError(SpeedmatrixError, ValueError):
    """The URL given is not one speedmatrix can measure (not http or https)."""


class ConnectError(TargetError):
    """No HTTP answer at all: refused, unresolvable, timed out, TLS failure, not HTTP."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach {url}: {reason}")
        self.url = url
        self.reason = reason


class HttpError(TargetError):
    """The server answered with a status >= 400 (or an answer we cannot use)."""

    def __init__(self, method: str, url: str, status: int, body: str) -> None:
        detail = redact(error_message(body))
        text = f"{method} {url} answered HTTP {status}"
        super().__init__(f"{text}: {detail}" if detail else text)
        self.method = method
        self.url = url
        self.status = status
        self.body = body
        #: a 429's Retry-After in seconds (None: absent or not a number)
        self.retry_after_s: float | None = None


class AuthError(HttpError):
    """401/403: the API key is missing or wrong."""

    def __init__(self, method: str, url: str, status: int, body: str, has_key: bool) -> None:
        super().__init__(method, url, status, body)
        hint = "the API key was refused" if has_key else "the server wants an API key (--api-key)"
        self.args = (f"{self.args[0]} ({hint})",)


class RedirectError(HttpError):
    """The server answered 3xx; we do not follow (credentials stay with the origin)."""

    def __init__(self, method: str, url: str, status: int, location: str) -> None:
        super().__init__(method, url, status, "")
        self.location = location
        self.args = (
            (
                f"{self.args[0]}: a redirect to {redact(location) or '(no location)'}, not "
                "followed (speedmatrix never sends credentials on a redirect; give --url the "
                "final address)"
            ),
        )


def error_message(body: str) -> str:
    """The human part of an engine's error body, whichever shape it has (OpenAI
    ``{"error": {"message"}}``, flat ``{"message"}``, TGI ``{"error": "..."}``, plain text)."""
    text = body.strip()
    if not text:
        return ""
    try:
        data = json.loads(text)
    except ValueError:
        if text[:1] == "<":
            return "an HTML page, not an API answer"
        return " ".join(text[:300].split())
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if isinstance(err, str) and err:
            return err[:300]
        for key in ("message", "detail"):
            if data.get(key):
                return str(data[key])[:300]
    return " ".join(text[:300].split())


def _retry_after_s(value: str | None) -> float | None:
    """Retry-After in seconds (delta-seconds form only; an HTTP date is not honoured)."""
    if not value:
        return None
    try:
        s = float(value.strip())
    except ValueError:
        return None
    return s if s >= 0 else None


class HttpClient:
    """JSON requests against one base URL (``http://host:port``, no trailing path needed).

    ``timeout_s`` bounds connecting, each read, and the whole request. The API key goes only
    into the ``Authorization`` header; it is not part of repr() or of any error message.
    The client may be shared between threads; ``close()`` (or ``with``) drops its idle
    connections at once instead of when they expire or the client is collected.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float | None = None,
        *,
        config: ClientConfig | None = None,
    ):
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UrlError(f"not an http(s) URL: {redact(base_url)!r}")
        if config is None:  # a client of its own: the URL's credentials, the environment's CAs
            config = ClientConfig.make(base_url, api_key)
        elif api_key and api_key != config.api_key:
            config = config.replace(api_key=api_key)
        if config.basic_auth is None and url_credentials(base_url):
            config = config.replace(basic_auth=url_credentials(base_url))
        if timeout_s is not None:
            config = config.replace(timeout_s=float(timeout_s))
        if parsed.username is not None or parsed.password is not None:
            # the URL we show and request has no credentials: they travel in the header
            host = parsed.hostname or ""
            host = f"[{host}]" if ":" in host else host
            netloc = host + (f":{parsed.port}" if parsed.port else "")
            base_url = urllib.parse.urlunsplit(parsed._replace(netloc=netloc))
        api_key = config.api_key
        if api_key and not all(" " < ch < "\x7f" for ch in api_key):
            # said here, without the key: a header could not carry it (h11 or the encoder
            # would fail with the value in its message)
            raise SpeedmatrixError(
                "the API key has characters an HTTP header cannot carry (printable ASCII "
                "without spaces only); check --api-key, its file or its variable"
            )
        self.config = config
        self._secrets: list[str] = config.secrets
        self.base_url = base_url.rstrip("/")
        self._origin = _origin(self.base_url)
        self._api_key = api_key or None
        self.timeout_s = config.timeout_s
        # decided now, as before: a bad --ca-file is an error of the client's creation
        self._ssl = config.ssl_context() if parsed.scheme == "https" else None
        self._budget = _Budget()
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        auth = ", api_key=<set>" if self._api_key else ""
        return f"HttpClient({self.base_url!r}{auth})"

    def __enter__(self) -> HttpClient:  # noqa: PYI034 - not subclassed
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the kept-alive connections; the client can still be used after."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    @property
    def has_api_key(self) -> bool:
        return self._api_key is not None

    def url(self, path: str) -> str:
        if path.startswith(("http://", "https://")):
            return path
        return self.base_url + "/" + path.lstrip("/")

    # ---- requests -------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout_s: float | None = None,
        accept: str = "application/json",
    ) -> tuple[int, str]:
        """Send one request; return (status, text) for 2xx, raise HttpError/ConnectError
        otherwise. ``body`` is JSON-encoded unless it is bytes."""
        url = self.url(path)
        if _origin(url) != self._origin:
            # an absolute URL of another origin (a server's own link): no credentials for it
            raise ConnectError(url, "not the server's own address; not requested")
        headers = {"Accept": accept, "User-Agent": "speedmatrix", "Accept-Encoding": "identity"}
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        auth = self.config.authorization
        if auth:
            headers["Authorization"] = auth
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            for attempt in range(MAX_429_RETRIES + 1):
                try:
                    return self._send(method, url, data, headers, timeout)
                except HttpError as exc:
                    wait = exc.retry_after_s if exc.status == 429 else None
                    if wait is None or wait > MAX_RETRY_AFTER_S or attempt == MAX_429_RETRIES:
                        raise
                    time.sleep(wait)
            raise AssertionError("unreachable")  # pragma: no cover
        except SpeedmatrixError as exc:
            exc.args = tuple(redact_known(list(exc.args), self._secrets))
            raise

    def _httpx_client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                import httpx

                self._client = httpx.Client(
                    transport=_transport(self.base_url, self._ssl, self._budget),
                    follow_redirects=False,
                    trust_env=False,  # proxies: the transport's, from the environment
                )
            return self._client

    def _send(
        self, method: str, url: str, data: bytes | None, headers: dict[str, str], timeout: float
    ) -> tuple[int, str]:
        client = self._httpx_client()
        budget = self._budget
        budget.start(timeout)
        try:
            req = client.build_request(method, url, content=data, headers=headers, timeout=timeout)
            try:
                resp = client.send(req, stream=True)
            except _transport_errors() as exc:
                raise _connect_error(exc, url, timeout, budget, in_body=False) from None
            try:
                return self._answer(resp, method, url, timeout)
            finally:
                resp.close()
        finally:
            budget.stop()

    def _answer(self, resp: httpx.Response, method: str, url: str, timeout: float):
        _check_headers(resp, url)
        status = resp.status_code
        if 200 <= status < 300:
            return status, _read_body(resp, url, self._budget, timeout)
        if status in (301, 302, 303, 307, 308):
            raise RedirectError(method, url, status, resp.headers.get("Location", ""))
        try:
            text = _read_body(resp, url, self._budget, timeout, limit=64 << 10)
        except ConnectError:
            text = ""
        if status in (401, 403):
            raise AuthError(method, url, status, text, self.has_api_key)
        err = HttpError(method, url, status, text)
        err.retry_after_s = _retry_after_s(resp.headers.get("Retry-After"))
        if status == 429 and err.retry_after_s is not None:
            err.args = (f"{err.args[0]} (Retry-After {err.retry_after_s:g} s)",)
        raise err

    def get_text(self, path: str, **kw: Any) -> str:
        return self.request("GET", path, accept="text/plain, */*", **kw)[1]

    def get_json(self, path: str, **kw: Any) -> Any:
        return self._decode("GET", path, self.request("GET", path, **kw)[1])

    def post_json(self, path: str, body: Any, **kw: Any) -> Any:
        return self._decode("POST", path, self.request("POST", path, body, **kw)[1])

    def _decode(self, method: str, path: str, text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError:
            what = (
                "an HTML page, not JSON (is this an LLM server?)"
                if text.lstrip()[:1] == "<"
                else f"answer is not JSON: {text[:120]!r}"
            )
            err = HttpError(method, self.url(path), 200, what)
            err.args = tuple(redact_known(list(err.args), self._secrets))
            raise err from None


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in: what must match for a
    request to carry the client's credentials."""
    p = urllib.parse.urlsplit(url)
    try:
        port = p.port
    except ValueError:
        port = -1  # a port that is not a number matches nothing
    if port is None:
        port = {"http": 80, "https": 443}.get(p.scheme)
    return p.scheme.lower(), (p.hostname or "").lower(), port


# ---- the transport: httpx's client over httpcore, with a byte count and a deadline ---------
class _Budget(threading.local):
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

    def __init__(self, inner: Any, budget: _Budget) -> None:
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

    def __init__(self, budget: _Budget) -> None:
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


def _transport(base_url: str, ssl_context: ssl.SSLContext | None, budget: _Budget) -> Any:
    return _transport_class()(base_url, ssl_context, budget)


@functools.cache
def _transport_class() -> type:
    """httpx's transport interface over an httpcore pool of our own (httpx's HTTPTransport
    does not take a network backend). httpcore's exceptions pass through unchanged;
    ``_connect_error`` reads them."""
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
        def __init__(self, base_url: str, ssl_context: ssl.SSLContext | None, budget: _Budget):
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


def _check_headers(resp: httpx.Response, url: str) -> None:
    """http.client's limits, which h11 (100 KiB in all) does not set: 100 headers, 64 KiB a
    line."""
    raw = resp.headers.raw
    if len(raw) > MAX_HEADERS:
        raise ConnectError(
            url, f"a broken HTTP answer (more than {MAX_HEADERS} headers: {len(raw)})"
        )
    if any(len(k) + len(v) + 2 > MAX_HEADER_LINE_BYTES for k, v in raw):
        raise ConnectError(url, "the answer has a header line over 64 KiB")


def _read_body(
    resp: httpx.Response, url: str, budget: _Budget, timeout: float, limit: int = MAX_BODY_BYTES
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
    except _transport_errors() as exc:
        raise _connect_error(exc, url, timeout, budget, in_body=True) from None
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
def _transport_errors() -> tuple[type[BaseException], ...]:
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


def _connect_error(
    exc: BaseException, url: str, timeout: float, budget: _Budget, in_body: bool
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
