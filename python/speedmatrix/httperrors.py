"""The one-line errors of the cold-path HTTP client (``speedmatrix.http``): a URL that cannot
be measured, no HTTP answer at all, an answer with a status >= 400, and the human part of an
engine's error body."""

from __future__ import annotations

import json

from speedmatrix.errors import SpeedmatrixError, TargetError
from speedmatrix.redact import redact

__all__ = ["AuthError", "ConnectError", "HttpError", "RedirectError", "UrlError", "error_message"]


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
