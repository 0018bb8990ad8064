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

The errors live in ``speedmatrix.httperrors``, the bounds httpx does not give (one deadline
for the whole request, header-line and header-count limits, the body's size) and the
one-line errors in ``speedmatrix.httptransport`` (both re-exported here), and the httpx side
(the pool, proxies as the standard library reads them, inflating under a cap) in
``speedmatrix.httppool``, imported on the first request.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import ssl
import threading
import time
import urllib.parse
import urllib.request
from types import ModuleType
from typing import TYPE_CHECKING, Any

from speedmatrix.errors import SpeedmatrixError
from speedmatrix.httperrors import (
    AuthError,
    ConnectError,
    HttpError,
    RedirectError,
    UrlError,
    error_message,
)
from speedmatrix.httptransport import (
    KEEPALIVE_S,
    MAX_BODY_BYTES,
    MAX_HEADER_LINE_BYTES,
    MAX_HEADERS,
    Budget,
    connect_error,
)
from speedmatrix.redact import redact, redact_known

if TYPE_CHECKING:
    import httpx

__all__ = [
    "KEEPALIVE_S",
    "MAX_BODY_BYTES",
    "MAX_HEADERS",
    "MAX_HEADER_LINE_BYTES",
    "AuthError",
    "ClientConfig",
    "ConnectError",
    "HttpClient",
    "HttpError",
    "RedirectError",
    "UrlError",
    "error_message",
]

#: the longest Retry-After honoured on a 429; a longer one is reported, not waited for
MAX_RETRY_AFTER_S = 10.0
#: how many 429s one request retries before it reports the last
MAX_429_RETRIES = 3


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
        self._budget = Budget()
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
                self._client = _pool().client(self.base_url, self._ssl, self._budget)
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
            except _pool().TRANSPORT_ERRORS as exc:
                raise connect_error(exc, url, timeout, budget, in_body=False) from None
            try:
                return self._answer(resp, method, url, timeout)
            finally:
                resp.close()
        finally:
            budget.stop()

    def _answer(self, resp: httpx.Response, method: str, url: str, timeout: float):
        _pool().check_headers(resp, url)
        status = resp.status_code
        if 200 <= status < 300:
            return status, _pool().read_body(resp, url, self._budget, timeout)
        if status in (301, 302, 303, 307, 308):
            raise RedirectError(method, url, status, resp.headers.get("Location", ""))
        try:
            text = _pool().read_body(resp, url, self._budget, timeout, limit=64 << 10)
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


def _pool() -> ModuleType:
    """``speedmatrix.httppool`` (httpx, httpcore), imported on the first request."""
    from speedmatrix import httppool  # start-up: `speedmatrix --help` does not pay for httpx

    return httppool


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
