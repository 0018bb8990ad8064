"""Secrets out of everything speedmatrix writes.

``redact(text)`` replaces the values of the usual secret-bearing flags, headers,
query parameters and environment assignments, and anything shaped like an API
key, by ``<redacted>``. ``redact_known(obj, secrets)`` replaces every known
secret value (the API key the user passed, say) anywhere in a JSON-like object.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"

# Secret-bearing names. Words that are secrets whatever precedes them take any prefix
# (--admin-api-key, --openai-api-key, --db-password, --jwt-secret) and a key/token suffix
# (--secret-key, --access-key-id); "token" only alone or after prefixes that make it a
# credential (--hf-token, --hf-api-token, --auth-token), so --max-token 5 stays as it is.
_STRONG = (
    r"api[-_]?keys?|secrets?|password|passwd|passphrase|private[-_]key|access[-_]keys?"
    r"|credentials?|jwt|auth"
)
_TOKEN_PREFIX = (
    r"hf|hub|huggingface|auth|access|api|bearer|github|gh|gitlab|refresh|session|id|openai"
    r"|admin|oauth|bot"
)
_SECRET_NAME = (
    rf"(?:[a-z0-9]+[-_])*(?:{_STRONG})(?:[-_](?:keys?|key[-_]id|tokens?))?"
    rf"|(?:(?:{_TOKEN_PREFIX})[-_]?)+tokens|(?:(?:{_TOKEN_PREFIX})[-_]?)*token|bearer"
)
_FLAG_NAMES = _SECRET_NAME
_VALUE = r"""(?:"[^"]*"|'[^']*'|[^\s"']+)"""
# env names that hold secrets, in `--env NAME VALUE` / `-e NAME VALUE` (launchers, docker)
_ENV_SECRET = r"[A-Za-z0-9_]*(?:KEY|TOKEN(?!S|IZ)|SECRET|PASSWORD|PASSWD|CREDENTIALS?)[A-Za-z0-9_]*"

# --api-key X, --api-key=X, --hf-token X; the values up to the next flag are taken: every one
# after a plural name (LMDeploy's --api-keys K1 K2), and after a singular one (vLLM's
# --api-key takes several keys: --api-key K1 K2) every one that is not a plain lowercase
# word. A value never starts with "-" ("--disable-auth --port 1") and is never a shell
# operator (&&, ||, |, ;), so the next command is kept.
_SHELL_OP = r"(?:&&|\|\||[|;&])(?!\S)"
_FLAG_RE = re.compile(
    rf"(?i)((?<![\w-])--?({_FLAG_NAMES})(?:=|\s+))(?!{REDACTED})(?!-)(?!{_SHELL_OP})({_VALUE})"
    rf"((?:[ \t]+(?!-)(?!{REDACTED})(?!{_SHELL_OP}){_VALUE})*)"
)


def _flag_repl(m: re.Match[str]) -> str:
    rest = m.group(4) or ""
    if rest:
        plural = m.group(2).lower().endswith("s")

        def value(v: re.Match[str]) -> str:
            # after a singular name, a plain lowercase word is prose ("--api-key X required"),
            # not a second key: key material has digits, capitals or symbols
            if plural or not re.fullmatch(r"[a-z]+", v.group(2)):
                return v.group(1) + REDACTED
            return v.group(0)

        rest = re.sub(rf"([ \t]+)({_VALUE})", value, rest)
    return m.group(1) + REDACTED + rest


_PATTERNS: list[tuple[re.Pattern[str], Any]] = [
    (_FLAG_RE, _flag_repl),
    # --env HF_TOKEN value, -e HF_TOKEN value
    (
        re.compile(rf"((?<![\w-])(?:-e|--env)\s+{_ENV_SECRET}\s+)(?!-)(?!{REDACTED})({_VALUE})"),
        r"\1" + REDACTED,
    ),
    # curl's -u user:password, --user user:password
    (
        re.compile(rf"((?<![\w-])(?:-u|--user)(?:=|\s+)[^\s:]+:)(?!{REDACTED})(\S+)"),
        r"\1" + REDACTED,
    ),
    # api-key style headers: x-api-key: X, api-key: X
    (re.compile(r"(?i)(\b(?:x-)?api-key\s*:\s*)([^\s\"',;]+)"), r"\1" + REDACTED),
    # Authorization: Bearer X / Basic X ; also 'Authorization: X'
    (
        re.compile(r"(?i)(authorization\s*[:=]\s*(?:bearer|basic|token)?\s*)([^\s\"',;]+)"),
        r"\1" + REDACTED,
    ),
    # bare Bearer X
    (re.compile(r"(?i)(\bbearer\s+)(?!<redacted>)([A-Za-z0-9._~+/=\-]+)"), r"\1" + REDACTED),
    # env-style NAME=VALUE where NAME looks secret (OPENAI_API_KEY, HF_TOKEN, MY_SECRET, ...)
    (
        re.compile(
            # TOKENS/TOKENIZER are counts and settings (MAX_TOKENS=4096), not credentials
            # NAME: VALUE too (docker/compose/k8s env lists, YAML): HF_TOKEN:X, HF_TOKEN: X
            r"\b([A-Z0-9_]*(?:API_?KEY|TOKEN(?!S|IZ)|SECRET|PASSWORD|PASSWD)[A-Z0-9_]*\s*[=:]\s*)"
            rf"(?!<redacted>)({_VALUE})"
        ),
        r"\1" + REDACTED,
    ),
    # query / key-value style: token=X, api_key=X, key=X, hf_token=X (URLs, JSON-ish text)
    (
        re.compile(
            rf"(?i)([?&;\s,{{(]|^)((?:{_SECRET_NAME}|key|auth|sig|signature)\s*=\s*)"
            r"(?!<redacted>)([^\s&#\"',;)}]+)"
        ),
        r"\1\2" + REDACTED,
    ),
    # JSON style "api_key": "X", "admin_api_key": "X", "hf_token": "X"
    (
        re.compile(
            rf"""(?i)(["'](?:{_SECRET_NAME}|authorization)["']\s*:\s*["'])"""
            r"""(?!<redacted>)([^"']+)(["'])"""
        ),
        r"\1" + REDACTED + r"\3",
    ),
    # user:password@ in URLs
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.\-]*://[^/\s:@]+:)([^@\s/]+)(@)"), r"\1" + REDACTED + r"\3"),
    # key-shaped tokens: sk-..., sk-proj-..., hf_..., ghp_..., xoxb-..., AKIA...
    (
        re.compile(
            r"\b(?:sk-[A-Za-z0-9_\-]{8,}|hf_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{20,}"
            r"|xox[abpr]-[A-Za-z0-9\-]{10,}|AKIA[0-9A-Z]{16})\b"
        ),
        REDACTED,
    ),
]


def redact(text: str) -> str:
    """Replace secret values in ``text`` by ``<redacted>``; other text stays as it was."""
    if not text:
        return text
    out = str(text)
    for pattern, repl in _PATTERNS:
        out = pattern.sub(repl, out)
    # A quoted value redacted by the flag rule keeps no quotes; tidy '<redacted>' doubling.
    return out.replace(f"{REDACTED}{REDACTED}", REDACTED)


def redact_known(obj: Any, secrets: list[str] | tuple[str, ...] | None) -> Any:
    """Return a copy of ``obj`` (dict / list / str / scalars) with every known secret replaced.

    Dict keys are scanned too. Secrets shorter than 4 characters are ignored
    (replacing them would mangle ordinary text); empty/None secrets are skipped.
    """
    vals = sorted(
        {s for s in (secrets or []) if isinstance(s, str) and len(s) >= 4}, key=len, reverse=True
    )
    if not vals:
        return obj

    def walk(x: Any) -> Any:
        if isinstance(x, str):
            for s in vals:
                if s in x:
                    x = x.replace(s, REDACTED)
            return x
        if isinstance(x, dict):
            return {walk(k): walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, tuple):
            return tuple(walk(v) for v in x)
        return x

    return walk(obj)
