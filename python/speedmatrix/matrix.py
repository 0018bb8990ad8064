"""The matrix definition: which cells a sweep measures and how.

A :class:`Matrix` is plain data. It is built in Python (notebooks, scripts), from the CLI
flags, from a preset, or from TOML, and it is saved in every run's metadata so a run says
exactly what it asked for. ``problems()`` returns every problem at once, each message starting
with the field it is about; ``validate()`` raises them as one ValueError.

Over 500 lines: every field a sweep reads (closed loop, steady-state window and precision,
open loop, SLOs) is defined here with its validation and its TOML form beside it, so a field
and its checks cannot drift apart.

Context entries are token counts or a keyword resolved against the server by
:mod:`speedmatrix.plan`:

- ``"max"`` in ``contexts`` (decode) — the largest context that fits the server's context
  length together with ``max_output`` and the safety margin;
- ``"max"`` in ``prefill_contexts`` — the largest prompt the server accepts (one output token);
- ``"max-decode"`` in ``prefill_contexts`` — the decode ``max`` value, so the prefill phase
  has a column for the longest decode row too (the seed report's 123K prefill column).
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import tomli_w

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover - Python 3.10
    pass

from speedmatrix import sparseaxes, trafficaxes
from speedmatrix.latency import DEFAULT_PERCENTILES, parse_percentiles
from speedmatrix.matrixfile import (
    changes_text,
    coerce_contexts,
    coerce_float_list,
    coerce_int_list,
    parse_typed,
    read_table,
    resolve_aliases,
)
from speedmatrix.slo import parse_attainment, parse_slo
from speedmatrix.units import format_tokens, parse_duration, parse_token_list, parse_tokens

__all__ = [
    "API_KINDS",
    "PREFILL_MODES",
    "PRESETS",
    "Context",
    "Matrix",
    "changes_text",
    "parse_arrival",
    "parse_contexts",
    "parse_precision",
    "preset_changes",
    "preset_record",
    "toml_fields",
]

Context = int | str

API_KINDS = ("completions", "chat")
PREFILL_MODES = ("warmup", "separate")
DECODE_KEYWORDS = ("max",)
PREFILL_KEYWORDS = ("max", "max-decode")
#: upper bounds of the matrix's values: beyond them a value is a typo (a missing unit, an
#: extra digit), not a setting; no model serves 100M tokens, no client holds 64K streams
MAX_TOKENS = 100_000_000
MAX_CONCURRENCY = 65_536
#: the most event loops a cell may ask for (the core's own bound)
MAX_CLIENT_THREADS = 1024
MAX_REPETITIONS = 1_000
#: a week: a window, timeout or drain longer than this is a typo
MAX_DURATION_S = 7 * 86_400.0
MAX_RATE_PER_S = 1e6
MAX_GAP_FACTOR = 1e6
_SECONDS_FIELDS: tuple[str, ...] = (
    "duration_s",
    "idle_timeout_s",
    "request_idle_timeout_s",
    "drain_timeout_s",
)
_SECONDS_FIELDS += ("min_duration_s", "stall_min_s", "ramp_cap_s")


@dataclass
class Matrix:
    """What to measure. Token counts are tokens, durations seconds."""

    contexts: list[Context] = field(default_factory=lambda: [8192])
    concurrency: list[int] = field(default_factory=lambda: [1])
    duration_s: float = 30.0
    max_output: int = 4096
    prefill_contexts: list[Context] = field(default_factory=list)
    api: str = "completions"
    #: merged into every request body (after the fields speedmatrix sets, so it wins)
    extra: dict[str, Any] = field(default_factory=dict)
    #: tokens every prompt of a cell shares at its start; 0 = every prompt unique;
    #: negative = all but the last |n| tokens are shared (see shared_prefix_for)
    shared_prefix: int = 0
    repetitions: int = 1
    warmup: bool = True
    #: seconds to wait for the server to be idle (no running or waiting requests) before a cell
    idle_timeout_s: float = 60.0
    #: a cell whose failed requests exceed this fraction of those started is an ``error``
    error_threshold: float = 0.05
    #: ``warmup``: a prefill figure comes from the cold first token of the N=1 decode
    #: warm-up of the same context (the seed's "measured during decode warm-up"), measured
    #: on its own only where no such decode cell runs; ``separate``: every prefill cell is
    #: measured on its own
    prefill_mode: str = "warmup"
    #: seconds a request may receive nothing before it is cancelled as stalled
    request_idle_timeout_s: float = 120.0
    #: seconds of quiet, after the server reports idle, before a cold prefill
    #: measurement: an engine finishes the iteration it was in (a prefill chunk of
    #: a request just cancelled) before it sees the next request
    prefill_cooldown_s: float = 1.0
    #: open loop: arrival rates in requests/s; when given, the decode cells are contexts ×
    #: rates (instead of × concurrency) and requests arrive on a schedule (docs/metrics.md)
    request_rates: list[float] = field(default_factory=list)
    #: open loop: "poisson", "constant" or "gamma:SHAPE" (gap CV 1/sqrt(SHAPE); 1 = Poisson)
    arrival: str = "poisson"
    #: open loop: at most this many requests in flight (0 = no gate); the rest wait, queued
    #: at the client, and that wait is part of their latency from the scheduled time
    max_concurrency: int = 0
    #: open loop: how long the window's requests may take to finish after its end
    drain_timeout_s: float = 60.0
    #: latency percentiles reported for every cell
    percentiles: list[float] = field(default_factory=lambda: list(DEFAULT_PERCENTILES))
    #: SLO targets in ms ({"ttft": 2000.0, "tpot": 50.0}); empty = no SLO figures
    slo: dict[str, float] = field(default_factory=dict)
    #: share of requests that must meet the SLO for a load to pass (capacity answer)
    attainment: float = 0.95
    #: "concurrency" or "rate": instead of the grid, find per context the largest load
    #: meeting the SLO by bracketing and bisecting from the first concurrency (rate)
    search: str = ""
    #: a workload file (JSONL prompt/messages with max_tokens, or ShareGPT JSON,
    #: speedmatrix.workload): its requests replace the synthetic prompts of every decode
    #: cell, each with its own output length; the context is then only the row's label
    prompts_file: str = ""
    #: precision target of a decode cell, a fraction (``"2%"`` or 0.02): the window ends
    #: as soon as the 95% intervals of total tok/s and median TBT are both within it
    #: (``duration_s`` is then the cap); 0 = fixed windows of ``duration_s``
    precision: float = 0.0
    #: the shortest window a precision target may end (seconds)
    min_duration_s: float = 5.0
    #: stall rule: a streaming request that gets no token for max(stall_min_s,
    #: stall_gap_factor x the cell's running median gap, its own pace) is cut as a ``stall``
    stall_min_s: float = 2.0
    stall_gap_factor: float = 25.0
    #: the longest ramp (send of the N requests to steady state) before the window
    #: opens anyway with the ``long_ramp`` flag; a cell's own cap is shorter when its
    #: expected TTFT is (see Sweep)
    ramp_cap_s: float = 180.0
    #: the client's event loops per cell (docs/SCALE.md): N, or 0 = auto (one per 256
    #: streams, at most the cores minus one); a precision stop or a --max-concurrency open
    #: loop runs one. The figures do not depend on it.
    client_threads: int = 0
    #: issue 23's traffic shapes (`speedmatrix.trafficaxes`), each replacing the closed-loop
    #: grid: shares of each prompt served from a warmed prefix (cells x fraction); one
    #: prefill every that many seconds beside N decoding streams; a trace replayed at
    #: speedup; N multi-turn sessions
    cached_fraction: list[float] = field(default_factory=list)
    interference_every_s: float = 0.0
    trace: str = ""
    speedup: float = 1.0
    #: sessions of that many turns (0 = none), each turn adding the answer and turn_tokens
    sessions: int = 0
    turn_tokens: int = 256
    think_time_s: float = 0.0
    #: "full" or "sparse" (`speedmatrix.sparseaxes`): measure a design, predict the rest
    plan: str = "full"
    sparse_target: float = 0.10
    sparse_max_cells: int = 0

    # ---- construction -------------------------------------------------------------------
    def __post_init__(self) -> None:
        # Accept the forms people type ("8k", "30s") without making validate() guess.
        self.contexts = coerce_contexts(self.contexts, DECODE_KEYWORDS)
        self.prefill_contexts = coerce_contexts(self.prefill_contexts, PREFILL_KEYWORDS)
        if isinstance(self.concurrency, (str, int)) and not isinstance(self.concurrency, bool):
            self.concurrency = coerce_int_list(self.concurrency)
        else:
            self.concurrency = list(self.concurrency)
        parse_typed(self, dict.fromkeys(_SECONDS_FIELDS, parse_duration))
        parse_typed(
            self,
            {
                "precision": parse_precision,
                "max_output": parse_tokens,
                "shared_prefix": parse_tokens,
            },
        )
        self.extra = dict(self.extra or {})
        self.request_rates = coerce_float_list(self.request_rates)
        if isinstance(self.percentiles, str):
            self.percentiles = list(parse_percentiles(self.percentiles))
        if isinstance(self.slo, str):
            self.slo = parse_slo(self.slo) if self.slo.strip() else {}
        if isinstance(self.attainment, str):
            self.attainment = parse_attainment(self.attainment)
        trafficaxes.coerce(self)
        sparseaxes.coerce(self)

    @classmethod
    def preset(cls, name: str) -> Matrix:
        """A named matrix: ``"seed"`` (the seed report's) or ``"quick"`` (small, for demos)."""
        try:
            factory = PRESETS[name]
        except KeyError:
            raise ValueError(
                f"unknown matrix preset {name!r}; presets: {', '.join(sorted(PRESETS))}"
            ) from None
        return factory()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Matrix:
        """From a mapping with this class's field names; ``duration``/``idle_timeout`` are
        accepted for ``duration_s``/``idle_timeout_s``. Unknown keys are an error."""
        data = resolve_aliases(data)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"{unknown[0]}: unknown matrix field (known: {', '.join(sorted(known))})"
            )
        try:
            return cls(**data)
        except ValueError as exc:
            raise ValueError(str(exc)) from None

    @classmethod
    def from_toml(cls, source: str | Path) -> Matrix:
        """From a TOML file path or TOML text. The keys may sit at top level or under
        ``[matrix]`` (then nothing may sit outside it); ``[matrix.extra]`` / ``[extra]``
        holds the extra request fields."""
        return cls.from_dict(read_table(source, _field_names()))

    # ---- output ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(asdict(self))

    def to_toml(self) -> str:
        """TOML text that :meth:`from_toml` reads back to an equal Matrix."""
        data = self.to_dict()
        extra = data.pop("extra")
        doc: dict[str, Any] = {"matrix": data}
        if extra:
            nulls = _null_paths(extra, "extra")
            if nulls:
                raise ValueError(f"{nulls[0]}: TOML has no null; leave the field out instead")
            data["extra"] = extra
        return tomli_w.dumps(doc)

    def save_toml(self, path: str | Path) -> None:
        Path(path).write_text(self.to_toml(), encoding="utf-8")

    def shared_prefix_for(self, context: int) -> int:
        """Shared prefix length in tokens for prompts of ``context`` tokens."""
        if self.shared_prefix >= 0:
            return self.shared_prefix
        return max(context + self.shared_prefix, 0)

    def labels(self) -> list[str]:
        """Decode context labels as given (keywords stay as they are)."""
        return [c if isinstance(c, str) else format_tokens(c) for c in self.contexts]

    # ---- validation -----------------------------------------------------------------------
    @property
    def extra_body(self) -> dict[str, Any]:
        """Alias of :attr:`extra` (the name of the CLI's ``--extra-body``)."""
        return self.extra

    @extra_body.setter
    def extra_body(self, value: dict[str, Any]) -> None:
        self.extra = dict(value)

    def validate(self) -> Matrix:
        """Raise ValueError listing every problem (each line starts with the field name);
        return self when valid."""
        errors = self.problems()
        if errors:
            raise ValueError("invalid matrix: " + "; ".join(errors))
        return self

    def problems(self) -> list[str]:
        """Every problem, one message each, starting with the field name; [] when valid."""
        errors: list[str] = []
        _check_contexts(errors, "contexts", self.contexts, DECODE_KEYWORDS, allow_empty=False)
        _check_contexts(
            errors, "prefill_contexts", self.prefill_contexts, PREFILL_KEYWORDS, allow_empty=True
        )
        self._concurrency_problems(errors)
        _seconds(errors, "duration_s", self.duration_s, positive=True)
        if not _is_positive_int(self.max_output):
            errors.append(f"max_output: {self.max_output!r} is not a positive integer")
        elif self.max_output > MAX_TOKENS:
            errors.append(f"max_output: {self.max_output} is above {MAX_TOKENS:,} tokens")
        if self.api not in API_KINDS:
            errors.append(f"api: {self.api!r} is not one of {', '.join(API_KINDS)}")
        self._prompt_problems(errors)
        if not _is_positive_int(self.repetitions):
            errors.append(f"repetitions: {self.repetitions!r} is not a positive integer")
        elif self.repetitions > MAX_REPETITIONS:
            errors.append(f"repetitions: {self.repetitions} is above {MAX_REPETITIONS}")
        if not isinstance(self.warmup, bool):
            errors.append(f"warmup: {self.warmup!r} is not true or false")
        _seconds(errors, "idle_timeout_s", self.idle_timeout_s, positive=False)
        if not _is_number(self.error_threshold) or not 0 <= self.error_threshold <= 1:
            errors.append(f"error_threshold: {self.error_threshold!r} is not a fraction in [0, 1]")
        if self.prefill_mode not in PREFILL_MODES:
            errors.append(
                f"prefill_mode: {self.prefill_mode!r} is not one of {', '.join(PREFILL_MODES)}"
            )
        _seconds(errors, "request_idle_timeout_s", self.request_idle_timeout_s, positive=True)
        _seconds(errors, "prefill_cooldown_s", self.prefill_cooldown_s, positive=False)
        self._open_loop_problems(errors)
        self._window_problems(errors)
        if not _is_int(self.client_threads) or not 0 <= self.client_threads <= MAX_CLIENT_THREADS:
            errors.append(
                f"client_threads: {self.client_threads!r} is not 0 (auto) or 1 to "
                f"{MAX_CLIENT_THREADS}"
            )
        errors += trafficaxes.problems(self) + sparseaxes.problems(self)
        return errors

    def _concurrency_problems(self, errors: list[str]) -> None:
        if not self.concurrency:
            errors.append("concurrency: at least one level is needed")
        for n in self.concurrency:
            if not _is_positive_int(n):
                errors.append(f"concurrency: {n!r} is not a positive integer")
        if len(set(self.concurrency)) != len(self.concurrency):
            errors.append("concurrency: levels repeat")
        for n in self.concurrency:
            if _is_positive_int(n) and n > MAX_CONCURRENCY:
                errors.append(f"concurrency: {n} is above the most streams, {MAX_CONCURRENCY}")

    def _prompt_problems(self, errors: list[str]) -> None:
        if not isinstance(self.extra, dict):
            errors.append("extra: must be a table of request fields")
        else:
            for key in self.extra:
                if not isinstance(key, str):
                    errors.append(f"extra: key {key!r} is not a string")
            for reserved in ("stream", "prompt", "messages"):
                if reserved in self.extra:
                    errors.append(f"extra: {reserved!r} is set by speedmatrix and cannot be given")
        if not (isinstance(self.shared_prefix, int) and not isinstance(self.shared_prefix, bool)):
            errors.append(f"shared_prefix: {self.shared_prefix!r} is not an integer")
        elif abs(self.shared_prefix) > MAX_TOKENS:
            errors.append(f"shared_prefix: {self.shared_prefix} is beyond {MAX_TOKENS:,} tokens")
        elif self.shared_prefix < 0:
            # "all but the last |n| tokens": needs a unique tail of at least one token
            smallest = [
                int(c) for c in self.contexts + self.prefill_contexts if _is_positive_int(c)
            ]
            if smallest and -self.shared_prefix >= min(smallest):
                errors.append(
                    f"shared_prefix: a unique tail of {-self.shared_prefix} tokens does not fit "
                    f"the {min(smallest)}-token context"
                )
        else:
            smallest = [
                int(c) for c in self.contexts + self.prefill_contexts if _is_positive_int(c)
            ]
            if self.shared_prefix and smallest and self.shared_prefix >= min(smallest):
                errors.append(
                    f"shared_prefix: {self.shared_prefix} tokens leaves no unique part in the "
                    f"{min(smallest)}-token context"
                )

    def _window_problems(self, errors: list[str]) -> None:
        """The window's rules: the precision stop, the stall rule, the ramp cap."""
        if not _is_number(self.precision) or not 0 <= self.precision < 1:
            errors.append(
                f"precision: {self.precision!r} is not a fraction in [0, 1) (write 2% or 0.02)"
            )
        if _seconds(errors, "min_duration_s", self.min_duration_s, positive=True) and (
            _is_number(self.duration_s)
            and _is_number(self.precision)
            and self.precision > 0
            and self.min_duration_s > self.duration_s
        ):
            errors.append(
                f"min_duration_s: {self.min_duration_s:g} s is longer than duration_s "
                f"({self.duration_s:g} s), the window's cap"
            )
        _seconds(errors, "stall_min_s", self.stall_min_s, positive=False)
        if not _is_number(self.stall_gap_factor) or not 0 < self.stall_gap_factor <= MAX_GAP_FACTOR:
            errors.append(
                f"stall_gap_factor: {self.stall_gap_factor!r} is not a number in "
                f"(0, {MAX_GAP_FACTOR:g}]"
            )
        _seconds(errors, "ramp_cap_s", self.ramp_cap_s, positive=True)

    def _open_loop_problems(self, errors: list[str]) -> None:
        seen: set[float] = set()
        for r in self.request_rates:
            if not _is_number(r) or not (0 < r <= MAX_RATE_PER_S):
                errors.append(
                    f"request_rates: {r!r} is not a positive number of requests/s (at most {MAX_RATE_PER_S:g})"
                )
            elif r in seen:
                errors.append(f"request_rates: {r:g} is listed twice")
            else:
                seen.add(r)
        try:
            parse_arrival(self.arrival)
        except ValueError as exc:
            errors.append(f"arrival: {exc}")
        if not isinstance(self.max_concurrency, int) or isinstance(self.max_concurrency, bool):
            errors.append(f"max_concurrency: {self.max_concurrency!r} is not an integer")
        elif self.max_concurrency < 0:
            errors.append(f"max_concurrency: {self.max_concurrency} is negative (0 = no gate)")
        elif self.max_concurrency > MAX_CONCURRENCY:
            errors.append(
                f"max_concurrency: {self.max_concurrency} is above the most streams, "
                f"{MAX_CONCURRENCY}"
            )
        _seconds(errors, "drain_timeout_s", self.drain_timeout_s, positive=False)
        try:
            parse_percentiles(self.percentiles)
        except (ValueError, TypeError) as exc:
            errors.append(f"percentiles: {exc}")
        if not isinstance(self.slo, dict):
            errors.append("slo: must be a table of targets in ms (ttft, tpot, e2e, tbt)")
        elif self.slo:
            try:
                parse_slo({k: f"{v}ms" for k, v in self.slo.items()})
            except ValueError as exc:
                errors.append(f"slo: {exc}")
        if not _is_number(self.attainment) or not 0 < self.attainment <= 1:
            errors.append(f"attainment: {self.attainment!r} is not a share in (0, 1]")
        if self.search not in ("", "concurrency", "rate"):
            errors.append(f"search: {self.search!r} is not concurrency or rate")
        elif self.search and not self.slo:
            errors.append("search: needs an SLO to search against (slo / --slo)")
        elif self.search == "concurrency" and self.request_rates:
            errors.append("search: concurrency with request rates: search rate instead")
        elif self.search == "rate" and not self.request_rates:
            errors.append("search: rate needs a starting rate (request_rates / --request-rate)")

    @property
    def open_loop(self) -> bool:
        """True when the decode cells are request-rate cells."""
        return bool(self.request_rates)


def parse_arrival(text: str) -> tuple[str, float]:
    """``"poisson"`` -> ("poisson", 1.0); ``"constant"``; ``"gamma:0.5"`` -> ("gamma", 0.5).
    Raises ValueError saying what is accepted."""
    kind, _, shape = str(text).strip().lower().partition(":")
    if kind in ("poisson", "constant") and not shape:
        return kind, 1.0
    if kind == "gamma":
        try:
            v = float(shape)
        except ValueError:
            raise ValueError(f"{text!r}: gamma needs a shape, e.g. gamma:0.5") from None
        if not v > 0 or v == float("inf"):
            raise ValueError(f"{text!r}: the gamma shape must be a positive number")
        return "gamma", v
    raise ValueError(f"{text!r} is not poisson, constant or gamma:SHAPE")


def preset_changes(matrix: Matrix, name: str) -> dict[str, dict[str, Any]]:
    """Where ``matrix`` differs from the preset ``name``: ``{field: {"preset": value,
    "run": value}}``, saved in run.json (``meta.run.preset``) so a run that started from a
    preset says how it is not that preset's matrix (the demo's shared prompts)."""
    base = Matrix.preset(name).to_dict()
    return {k: {"preset": base[k], "run": v} for k, v in matrix.to_dict().items() if base[k] != v}


def preset_record(matrix: Matrix, name: str) -> dict[str, Any]:
    """run.json's ``meta.run.preset``: the preset's name, :func:`preset_changes` and
    :func:`changes_text` ("" when the matrix is the preset's)."""
    changes = preset_changes(matrix, name)
    return {"name": name, "changes": changes, "text": changes_text(name, changes)}


def toml_fields(source: str | Path) -> set[str]:
    """The fields a matrix file sets (aliases as their field names): where a dry run says
    a setting came from."""
    return set(resolve_aliases(read_table(source, _field_names())))


# ---- helpers ------------------------------------------------------------------------------
def _field_names() -> set[str]:
    return {f.name for f in fields(Matrix)}


def _null_paths(value: Any, path: str) -> list[str]:
    if value is None:
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _null_paths(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _null_paths(v, f"{path}[{i}]")]
    return []


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """An int or a finite float: NaN and infinity are no setting (NaN passes every < test)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _seconds(errors: list[str], name: str, value: Any, *, positive: bool) -> bool:
    """Checks a duration field (a finite number of seconds, > 0 or >= 0, at most
    MAX_DURATION_S); appends one message and returns False when it is not one."""
    low_ok = _is_number(value) and (value > 0 if positive else value >= 0)
    if low_ok and value <= MAX_DURATION_S:
        return True
    what = "a positive number" if positive else "a number"
    errors.append(f"{name}: {value!r} is not {what} of seconds (at most {MAX_DURATION_S:g})")
    return False


def _check_contexts(
    errors: list[str], name: str, values: list, keywords: tuple[str, ...], allow_empty: bool
) -> None:
    if not values and not allow_empty:
        errors.append(f"{name}: at least one context is needed")
    seen: set = set()
    for value in values:
        if isinstance(value, str):
            if value not in keywords:
                errors.append(
                    f"{name}: {value!r} is neither a token count (8192, 8k) nor one of "
                    f"{', '.join(repr(k) for k in keywords)}"
                )
        elif not _is_positive_int(value):
            errors.append(f"{name}: {value!r} is not a positive token count")
        elif value > MAX_TOKENS:
            errors.append(f"{name}: {value} is above {MAX_TOKENS:,} tokens")
        if value in seen:
            errors.append(f"{name}: {value!r} is listed twice")
        seen.add(value)


def _seed() -> Matrix:
    return Matrix(
        contexts=[8192, 16384, 32768, 65536, "max"],
        concurrency=[1, 2, 4, 8, 16, 32, 64, 128],
        duration_s=30.0,
        max_output=4096,
        prefill_contexts=[8192, 16384, 32768, 65536, "max-decode", "max"],
        api="completions",
    )


def _quick() -> Matrix:
    return Matrix(
        contexts=[1024, 4096],
        concurrency=[1, 4],
        duration_s=3.0,
        max_output=256,
        prefill_contexts=[1024, 4096],
        api="completions",
        idle_timeout_s=10.0,
    )


PRESETS = {"seed": _seed, "quick": _quick}


def parse_precision(text: str | float) -> float:
    """A precision target: ``"2%"`` -> 0.02, ``"0.02"`` -> 0.02; ValueError otherwise."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ValueError(f"precision: {text!r} is not a percentage (2%) or a fraction") from None
    if not 0 <= value < 1:
        raise ValueError(f"precision: {text!r} is not in [0, 100%)")
    return value


def parse_contexts(text: str | list, *, prefill: bool = False) -> list[Context]:
    """Contexts from CLI text (``"8k,16k,max"``); ValueError names the bad item."""
    return parse_token_list(text, keywords=PREFILL_KEYWORDS if prefill else DECODE_KEYWORDS)
