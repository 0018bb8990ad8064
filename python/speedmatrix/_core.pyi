"""Type stubs of the compiled core (cpp/bindings). See docs/internals.md section 1."""

import enum
from collections.abc import Iterable, Sequence
from typing import TypedDict

import numpy as np
import numpy.typing as npt

version: str

class ApiKind(enum.Enum):
    completions = 0
    chat = 1

class CellSpec:
    """What one cell sends, to where, for how long. Lists are copied in and out:
    assign a new list rather than appending to the one a getter returned."""

    url: str
    headers: list[str]
    api_key: str  # sent as "Authorization: Bearer ..."; reads back as "***" (never returned)
    api: ApiKind
    warmup_timeout_s: float  # one try of the warm-up; then what failed is sent again
    warmup_retries: int  # default 1
    concurrency: int
    duration_s: float  # window length; the cap when precision > 0
    max_requests: int
    mode: str  # "closed" | "open"
    rate_per_s: float
    arrival: str  # "poisson" | "constant" | "gamma"
    gamma_shape: float
    schedule_ns: list[int]
    max_concurrency: int  # open loop: > 0 gates in-flight requests
    seed: int
    drain_timeout_s: float
    steady_window: bool  # default True: the window opens at steady state (cell.hpp)
    ramp_cap_s: float  # the ramp opens the window anyway after this (CellResult.ramp_capped)
    plateau_settle_s: float
    stall_min_s: float  # stall rule: no token for max(stall_min_s, factor x median gap, own pace)
    stall_gap_factor: float
    stall_pause_cap_s: float  # a silence every stream shares is spared this long
    # connections failing in a row for this long (and >= 5 of them) end the cell
    # ("unreachable", stop_reason); <= 0: never
    unreachable_after_s: float
    precision: float  # 0.02 = stop at a 2% half-width of total tok/s and median TBT; 0 = off
    min_duration_s: float
    precision_check_s: float
    connect_timeout_s: float
    idle_timeout_s: float
    tls_verify: bool  # https: verify certificate and host name
    ca_file: str  # https: PEM CA bundle, "" = the system's
    max_event_bytes: int
    record_events: bool
    server_stamps: bool
    metrics_url: str
    metrics_interval_s: float
    metric_names: list[str]
    metric_reduce: list[str]  # per metric_names entry: "sum" (default) or "max"
    # past these many in memory, token events / finished request records go to unlinked
    # files in spill_dir ("" = $TMPDIR, else /tmp); 0 = all in memory
    spill_events: int
    spill_requests: int
    spill_dir: str
    # event loops: N > 1 on their own threads, 1 one loop, 0 auto (ceil(streams / 256),
    # at most the cores minus one)
    client_threads: int
    # keep each request's delivered content text and streamed token ids (CellResult.outputs),
    # at most keep_output_max_bytes a request (text bytes + 4 a token id; then truncated)
    keep_output: bool
    keep_output_max_bytes: int
    # free-running sessions (chain.hpp): their later turns are pushed into it while the
    # cell runs; concurrency == chain.sessions == len(bodies)
    chain: ChainFeed | None
    def __init__(self) -> None: ...
    @property
    def bodies(self) -> list[bytes]: ...
    @bodies.setter
    def bodies(self, value: Iterable[bytes | str]) -> None: ...
    @property
    def warmup_bodies(self) -> list[bytes]: ...
    @warmup_bodies.setter
    def warmup_bodies(self, value: Iterable[bytes | str]) -> None: ...

class Requests(TypedDict):
    slot: npt.NDArray[np.int32]
    body: npt.NDArray[np.int32]
    phase: npt.NDArray[np.uint8]  # 0 warm-up, 1 window
    scheduled_ns: npt.NDArray[np.int64]  # -1 = never
    sent_ns: npt.NDArray[np.int64]
    first_byte_ns: npt.NDArray[np.int64]
    first_token_ns: npt.NDArray[np.int64]  # first text on any channel (reasoning or content)
    first_content_ns: npt.NDArray[np.int64]  # first visible content (not reasoning); -1 = never
    done_ns: npt.NDArray[np.int64]
    http_status: npt.NDArray[np.int32]
    prompt_tokens: npt.NDArray[np.int64]  # -1 unknown
    output_tokens: npt.NDArray[np.int64]  # every channel, reasoning included
    # usage.completion_tokens_details.reasoning_tokens / usage.prompt_tokens_details.cached_tokens;
    # -1 where the server did not say
    reasoning_tokens: npt.NDArray[np.int64]
    cached_tokens: npt.NDArray[np.int64]
    reasoning_deltas: npt.NDArray[np.int32]  # chunks that carried non-empty reasoning
    # 0 none, 1 chunks, 2 usage_final, 3 usage_continuous, 4 usage below the text chunks
    # (counted as received), 5 final usage far above them (kept): openai.hpp TokenSource
    token_source: npt.NDArray[np.uint8]
    outcome: npt.NDArray[np.uint8]  # 0 pending, 1 ok, 2 cancelled, 3 error
    finish_reason: list[str]
    error_kind: list[str]
    error_message: list[str]
    retries: npt.NDArray[np.int32]  # re-sent on a new connection (reused one died first)

class Events(TypedDict):
    request: npt.NDArray[np.int32]
    t_ns: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.int32]
    server_ns: npt.NDArray[np.int64]  # -1 unless CellSpec.server_stamps

class Metrics(TypedDict):
    names: list[str]
    t_ns: npt.NDArray[np.int64]  # (T,)
    values: npt.NDArray[np.float64]  # (T, len(names)); NaN where absent
    failures: int

class Progress(TypedDict):
    tokens: int
    completed: int
    errors: int
    in_flight: int
    first_tokens: int  # window requests that got their first token so far
    window_start_ns: int  # -1 during the warm-up and the ramp
    warmup_total: int
    warmup_done: int
    # the /metrics sampler's latest sample by metric name (None: absent from that scrape);
    # {} when the cell samples no /metrics or no scrape succeeded yet
    metrics: dict[str, float | None]
    metrics_t_ns: int  # when that scrape was asked; -1 before the first
    metrics_samples: int  # successful scrapes so far
    metrics_failures: int  # failed scrapes so far

class RequestOutput:
    @property
    def text(self) -> str: ...  # content text (invalid UTF-8 replaced)
    @property
    def token_ids(self) -> list[int] | None: ...  # None: the stream carried no token_ids
    @property
    def truncated(self) -> bool: ...  # the cap was reached: text and ids stop there

class FinishedTurn:
    """A session's turn that ended (chain.hpp)."""

    @property
    def session(self) -> int: ...
    @property
    def turn(self) -> int: ...
    @property
    def body(self) -> int: ...  # turn x sessions + session
    @property
    def outcome(self) -> int: ...  # the records' outcome code (1: ok)
    @property
    def error_kind(self) -> str: ...
    @property
    def sent_ns(self) -> int: ...
    @property
    def done_ns(self) -> int: ...
    @property
    def due_ns(self) -> int: ...  # the session's next turn is sent no sooner
    @property
    def output(self) -> RequestOutput: ...

class ChainFeed:
    """Free-running sessions' later turns, pushed while the cell runs (chain.hpp)."""

    def __init__(self, sessions: int, turns: int, think_time_s: float = 0.0) -> None: ...
    @property
    def sessions(self) -> int: ...
    @property
    def turns(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def next_finished(self, timeout_s: float) -> FinishedTurn | None: ...
    def push(self, session: int, body: bytes) -> bool: ...
    def end_session(self, session: int) -> bool: ...
    def close(self) -> None: ...
    def ready_ns(self) -> list[int]: ...

class CellResult:
    @property
    def warmup_start_ns(self) -> int: ...
    @property
    def ramp_start_ns(self) -> int: ...
    @property
    def window_start_ns(self) -> int: ...
    @property
    def ramp_capped(self) -> bool: ...
    @property
    def stopped_by(
        self,
    ) -> str: ...  # "duration" | "precision" | "requests" | "stop" | "unreachable"
    @property
    def stop_reason(self) -> str: ...  # "unreachable": why, one line ("" otherwise)
    @property
    def stalls(self) -> int: ...
    @property
    def warmup_retried(self) -> int: ...
    @property
    def backoffs(self) -> int: ...  # closed loop: slot waits after a 429 / refused connection
    @property
    def backoff_s(self) -> float: ...  # the slot time those waits took in the window
    @property
    def window_end_ns(self) -> int: ...
    @property
    def end_ns(self) -> int: ...
    @property
    def client_cpu_s(self) -> float: ...
    @property
    def client_threads(self) -> int: ...
    @property
    def loop_lag_max_ms(self) -> float: ...
    @property
    def stopped(self) -> bool: ...
    @property
    def fatal_error(self) -> str: ...
    @property
    def events_note(self) -> str: ...  # why the events stayed in memory ("" = as planned)
    @property
    def requests_note(self) -> str: ...  # why the request records stayed in memory
    @property
    def requests_spilled(self) -> int: ...  # request records that went to the spill files
    @property
    def requests(self) -> Requests: ...
    @property
    def events(self) -> Events: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def outputs(self) -> list[RequestOutput]: ...  # one a request with keep_output, else []

class CellRunner:
    def __init__(self, spec: CellSpec) -> None: ...
    def run(self) -> CellResult:
        """Runs the cell on the calling thread with the GIL released; call once."""
    def stop(self) -> None:
        """From another thread: ends the cell early, keeps the records."""
    def progress(self) -> Progress: ...

class Figures(TypedDict):
    measured_s: float
    output_tokens: int
    total_tok_s: float
    tbt_ms: float
    per_request_tok_s: float
    ttft_ms: float  # first wave and refills (ttft_from_ns = the ramp's start)
    ttft_first_wave_ms: float
    decode_tok_s_per_request: float
    decode_requests: int
    decode_tok_s_per_request_ci: list[float]
    error_slot_s: float
    precision: float
    avg_active: float
    completed: int
    started: int
    errors: int
    total_tok_s_ci: list[float]  # [lo, hi]
    tbt_ms_ci: list[float]
    per_request_tok_s_ci: list[float]
    ttft_ms_ci: list[float]
    drift: float
    drifting: bool
    ttft_p90_ms: float
    ttft_p99_ms: float
    tbt_p90_ms: float
    tbt_p99_ms: float
    tbt_count: int
    tbt_mean_ms: float
    tbt_quantiles_ms: list[float]
    bin_tok_s: list[float]

def summarize_cell(
    requests: Requests | dict,
    events: Events | dict,
    t0_ns: int,
    t1_ns: int,
    bin_s: float = 1.0,
    steady_from_ns: int = -1,
    ttft_from_ns: int = -1,
    tbt_qs: list[float] = ...,
) -> Figures: ...

CONFIDENCE: float
Z_TWO_SIDED: float

def t_quantile(df: int) -> float: ...
def interference_figures(
    streams: Sequence[Sequence[int]],
    prefills: Sequence[tuple[int, int]],
    long_gap_ns: int = 100_000_000,
) -> dict[str, float]: ...
def quantiles(values: np.ndarray, qs: list[float]) -> list[tuple[float, float, float]]: ...
def coalesced_share(
    requests: Requests | dict, events: Events | dict, t0_ns: int, t1_ns: int
) -> float: ...
def precision_stop(
    total_tok_s: float,
    total_tok_s_ci: tuple[float, float],
    tbt_ms: float,
    tbt_ms_ci: tuple[float, float],
    target: float,
    elapsed_s: float,
    min_duration_s: float,
) -> tuple[bool, float]: ...

class Arrivals(TypedDict):
    request: np.ndarray  # int32
    t_ns: np.ndarray  # int64
    tokens: np.ndarray  # int64
    gap_ms: np.ndarray  # float64, NaN for a request's first arrival

class RequestTokens(TypedDict):
    tokens: np.ndarray  # int64
    window_tokens: np.ndarray  # int64
    first_ns: np.ndarray  # int64, -1 without an arrival
    last_ns: np.ndarray  # int64, -1 without an arrival
    max_gap_ms: np.ndarray  # float64, NaN without a gap

def request_tokens(
    requests: Requests | dict, events: Events | dict, t0_ns: int, t1_ns: int
) -> RequestTokens: ...
def token_arrivals(
    requests: Requests | dict, events: Events | dict, phase: int = 1
) -> Arrivals: ...
def parse_prometheus(
    text: str, strict: bool = False
) -> list[tuple[str, dict[str, str], float]]: ...
def reduce_prometheus(text: str, names: list[str], how: list[str] = ...) -> list[float]: ...
def now_ns() -> int: ...
def arrival_offsets_ns(
    arrival: str, rate_per_s: float, gamma_shape: float, seed: int, duration_s: float
) -> list[int]: ...
