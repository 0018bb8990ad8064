"""A small JSON-over-HTTP client for the cold path: discovery, tokenize, calibration.

Standard library only (urllib), one request at a time, with errors that say what went wrong
in one line. It is never used to measure anything: cells are run by the C++ core.

Hostile answers are bounded: a body larger than ``MAX_BODY_BYTES`` (after decompression) or
one that takes longer than the request's timeout to arrive is an error, as are header lines
over 64 KiB and more than 100 headers (http.client's own limits), and bytes that are not
HTTP at all. Redirects are not followed (``Authorization`` must never travel to another
origin; an LLM API that redirects is misconfigured): the error names the new location so the
user can pass it as ``--url``. A 429 with ``Retry-After`` is retried after the wait it asks
for when that wait is at most ``MAX_RETRY_AFTER_S``. Every error message is redacted, and the
client's own key is replaced wherever the server echoed it.

TLS: ``configure_tls(ca_file, insecure)`` sets the process's choice (the CLI's ``--ca-file``
and ``--insecure``); every client and the C++ core's cells read it through ``tls_settings()``.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from typing import Any

from speedmatrix.errors import SpeedmatrixError, TargetError
from speedmatrix.redact import redact, redact_known

__all__ = [
    "AuthError",
    "ConnectError",
    "HttpClient",
    "HttpError",
    "UrlError",
    "configure_tls",
    "error_message",
    "tls_settings",
]

#: the largest answer body read (discovery answers are a few KiB; /v1/models of a big
#: registry a few MiB); a larger one is an error, never held in memory
MAX_BODY_BYTES = 16 << 20
#: the longest Retry-After honoured on a 429; a longer one is reported, not waited for
MAX_RETRY_AFTER_S = 10.0
#: how many 429s one request retries before it reports the last
MAX_429_RETRIES = 3
_CHUNK = 64 << 10

_tls: dict[str, Any] = {"ca_file": None, "insecure": False}


def configure_tls(ca_file: str | None = None, insecure: bool = False) -> None:
    """Sets how every https request of this process verifies the server: against ``ca_file``
    (PEM) or the system's CAs, or not at all (``insecure``)."""
    _tls["ca_file"] = str(ca_file) if ca_file else None
    _tls["insecure"] = bool(insecure)


def tls_settings() -> dict[str, Any]:
    """``{"ca_file": str | None, "insecure": bool}`` as set by configure_tls()."""
    return dict(_tls)


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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise RedirectError(req.get_method(), req.full_url, code, newurl)


def _ssl_context() -> ssl.SSLContext:
    if _tls["insecure"]:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        return ssl.create_default_context(cafile=_tls["ca_file"])
    except (OSError, ssl.SSLError) as exc:
        raise SpeedmatrixError(f"--ca-file {_tls['ca_file']}: cannot load it ({exc})") from None


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

    ``timeout_s`` bounds connecting, each read, and the whole body. The API key goes only
    into the ``Authorization`` header; it is not part of repr() or of any error message.
    """

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 10.0):
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UrlError(f"not an http(s) URL: {redact(base_url)!r}")
        self._basic: str | None = None
        self._secrets: list[str] = [api_key] if api_key else []
        if parsed.username is not None or parsed.password is not None:
            # user:password@host → Basic auth; the URL we show and request has no credentials
            pair = f"{urllib.parse.unquote(parsed.username or '')}:"
            pair += urllib.parse.unquote(parsed.password or "")
            self._basic = "Basic " + base64.b64encode(pair.encode()).decode()
            if parsed.password:
                self._secrets += [parsed.password, urllib.parse.unquote(parsed.password)]
            host = parsed.hostname or ""
            host = f"[{host}]" if ":" in host else host
            netloc = host + (f":{parsed.port}" if parsed.port else "")
            base_url = urllib.parse.urlunsplit(parsed._replace(netloc=netloc))
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key or None
        self.timeout_s = timeout_s
        handlers: list[Any] = [_NoRedirect()]
        if parsed.scheme == "https":
            handlers.append(urllib.request.HTTPSHandler(context=_ssl_context()))
        self._opener = urllib.request.build_opener(*handlers)

    def __repr__(self) -> str:
        auth = ", api_key=<set>" if self._api_key else ""
        return f"HttpClient({self.base_url!r}{auth})"

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
        if urllib.parse.urlsplit(url).netloc != urllib.parse.urlsplit(self.base_url).netloc:
            # an absolute URL of another origin (a server's own link): no credentials for it
            raise ConnectError(url, "not the server's own address; not requested")
        headers = {"Accept": accept, "User-Agent": "speedmatrix", "Accept-Encoding": "identity"}
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        elif self._basic:
            headers["Authorization"] = self._basic
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            for attempt in range(MAX_429_RETRIES + 1):
                req = urllib.request.Request(url, data=data, headers=headers, method=method)
                try:
                    return self._send(req, method, url, timeout)
                except HttpError as exc:
                    wait = exc.retry_after_s if exc.status == 429 else None
                    if wait is None or wait > MAX_RETRY_AFTER_S or attempt == MAX_429_RETRIES:
                        raise
                    time.sleep(wait)
            raise AssertionError("unreachable")  # pragma: no cover
        except SpeedmatrixError as exc:
            exc.args = tuple(redact_known(list(exc.args), self._secrets))
            raise

    def _send(self, req: urllib.request.Request, method: str, url: str, timeout: float):
        deadline = time.monotonic() + timeout
        try:
            with self._opener.open(req, timeout=timeout) as resp:
                return resp.status, _read_body(resp, url, deadline, timeout)
        except RedirectError:
            raise
        except urllib.error.HTTPError as exc:
            text = ""
            if exc.fp is not None:
                try:
                    text = _read_body(exc, url, deadline, timeout, limit=64 << 10)
                except (ConnectError, OSError, http.client.HTTPException):
                    text = ""
            if exc.code in (401, 403):
                raise AuthError(method, url, exc.code, text, self.has_api_key) from None
            err = HttpError(method, url, exc.code, text)
            err.retry_after_s = _retry_after_s(
                exc.headers.get("Retry-After") if exc.headers else None
            )
            if exc.code == 429 and err.retry_after_s is not None:
                err.args = (f"{err.args[0]} (Retry-After {err.retry_after_s:g} s)",)
            raise err from None
        except urllib.error.URLError as exc:
            raise ConnectError(url, _reason(exc.reason)) from None
        except TimeoutError:
            raise ConnectError(url, f"no answer within {timeout:g} s") from None
        except http.client.RemoteDisconnected:
            raise ConnectError(url, "the server closed the connection without answering") from None
        except http.client.LineTooLong:
            raise ConnectError(url, "the answer has a header line over 64 KiB") from None
        except http.client.BadStatusLine:
            raise ConnectError(url, "the answer is not HTTP") from None
        except http.client.HTTPException as exc:
            raise ConnectError(url, f"a broken HTTP answer ({str(exc)[:120]})") from None
        except (ConnectionError, OSError) as exc:
            raise ConnectError(url, _reason(exc)) from None

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


def _read_body(
    resp: Any, url: str, deadline: float, timeout: float, limit: int = MAX_BODY_BYTES
) -> str:
    """The body as text, at most ``limit`` bytes (decompressed, when the server compressed it
    although asked not to) and within ``deadline``; otherwise a ConnectError."""
    encoding = (resp.headers.get("Content-Encoding") or "").strip().lower() if resp.headers else ""
    inflate = None
    if encoding in ("gzip", "x-gzip", "deflate"):
        inflate = zlib.decompressobj(47 if encoding != "deflate" else 15 + 32)
    elif encoding not in ("", "identity"):
        raise ConnectError(url, f"the answer is encoded as {encoding!r}, which is not supported")
    length = resp.headers.get("Content-Length") if resp.headers else None
    if length and length.strip().isdigit() and int(length) > limit and inflate is None:
        raise ConnectError(url, f"the answer is {int(length):,} bytes, over the {limit:,} read")
    # read1: whatever one recv brings, so a trickle cannot hold a 64 KiB read past the deadline
    read = getattr(resp, "read1", None) or resp.read
    parts: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise ConnectError(url, f"the answer did not end within {timeout:g} s")
        chunk = read(_CHUNK)
        if not chunk:
            break
        if inflate is not None:
            try:
                chunk = inflate.decompress(chunk, limit + 1 - size)
            except zlib.error:
                raise ConnectError(url, f"the answer's {encoding} body is corrupt") from None
        size += len(chunk)
        if size > limit:
            raise ConnectError(url, f"the answer is over {limit:,} bytes; not read further")
        parts.append(chunk)
    return b"".join(parts).decode("utf-8", "replace")


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
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower() if reason.strerror else str(reason)
    return str(reason)
