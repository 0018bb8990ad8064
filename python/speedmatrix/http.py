"""A small JSON-over-HTTP client for the cold path: discovery, tokenize, calibration.

Standard library only (urllib), one request at a time, with timeouts, Bearer auth and errors
that say what went wrong in one line. It is never used to measure anything: cells are run by
the C++ core.
"""

from __future__ import annotations

import base64
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from speedmatrix.errors import TargetError

__all__ = ["AuthError", "ConnectError", "HttpClient", "HttpError", "error_message"]


class ConnectError(TargetError):
    """No HTTP answer at all: refused, unresolvable, timed out, TLS failure."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach {url}: {reason}")
        self.url = url
        self.reason = reason


class HttpError(TargetError):
    """The server answered with a status >= 400."""

    def __init__(self, method: str, url: str, status: int, body: str) -> None:
        detail = error_message(body)
        text = f"{method} {url} answered HTTP {status}"
        super().__init__(f"{text}: {detail}" if detail else text)
        self.method = method
        self.url = url
        self.status = status
        self.body = body


class AuthError(HttpError):
    """401/403: the API key is missing or wrong."""

    def __init__(self, method: str, url: str, status: int, body: str, has_key: bool) -> None:
        super().__init__(method, url, status, body)
        hint = "the API key was refused" if has_key else "the server wants an API key (--api-key)"
        self.args = (f"{self.args[0]} ({hint})",)


def error_message(body: str) -> str:
    """The human part of an engine's error body, whichever shape it has (OpenAI
    ``{"error": {"message"}}``, flat ``{"message"}``, TGI ``{"error": "..."}``, plain text)."""
    text = body.strip()
    if not text:
        return ""
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if isinstance(err, str) and err:
            return err[:300]
        for key in ("message", "detail"):
            if data.get(key):
                return str(data[key])[:300]
    return text[:300]


class HttpClient:
    """JSON requests against one base URL (``http://host:port``, no trailing path needed).

    ``timeout_s`` applies to connecting and to each read. The API key goes only into the
    ``Authorization`` header; it is not part of repr() or of any error message.
    """

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 10.0):
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._basic: str | None = None
        if parsed.username is not None or parsed.password is not None:
            # user:password@host → Basic auth; the URL we show and request has no credentials
            pair = f"{urllib.parse.unquote(parsed.username or '')}:"
            pair += urllib.parse.unquote(parsed.password or "")
            self._basic = "Basic " + base64.b64encode(pair.encode()).decode()
            host = parsed.hostname or ""
            host = f"[{host}]" if ":" in host else host
            netloc = host + (f":{parsed.port}" if parsed.port else "")
            base_url = urllib.parse.urlunsplit(parsed._replace(netloc=netloc))
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key or None
        self.timeout_s = timeout_s

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
        headers = {"Accept": accept, "User-Agent": "speedmatrix"}
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        elif self._basic:
            headers["Authorization"] = self._basic
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace") if exc.fp is not None else ""
            if exc.code in (401, 403):
                raise AuthError(method, url, exc.code, text, self.has_api_key) from None
            raise HttpError(method, url, exc.code, text) from None
        except urllib.error.URLError as exc:
            raise ConnectError(url, _reason(exc.reason)) from None
        except TimeoutError:
            raise ConnectError(url, f"no answer within {timeout:g} s") from None
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
            raise HttpError(
                method, self.url(path), 200, f"answer is not JSON: {text[:120]!r}"
            ) from None


def _reason(reason: object) -> str:
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return "timed out"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve the host name ({reason.strerror or reason})"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower() if reason.strerror else str(reason)
    return str(reason)
