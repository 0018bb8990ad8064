"""The built-in engine: start, query and stop `speedmatrix-sim`.

    from speedmatrix.sim import Sim
    with Sim("seed-h200") as sim:
        print(sim.url)            # http://127.0.0.1:PORT
        sim.state()               # GET /sim/state
        sim.trace()               # GET /sim/trace: the decode steps the engine ran

The binary's CLI and endpoints are described in docs/internals.md §2; profiles
are the JSON files beside this module in ``profiles/`` (names = file stems).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from speedmatrix.cliargs import number_in
from speedmatrix.cliargs import port as port_arg
from speedmatrix.errors import SpeedmatrixError

_PROFILES = Path(__file__).resolve().parent / "profiles"
_LISTEN_PREFIX = "speedmatrix-sim listening on "

__all__ = ["Sim", "SimError", "list_profiles", "load_profile", "main", "profile_path"]


class SimError(SpeedmatrixError, RuntimeError):
    """The built-in engine could not be started or did not answer."""


def list_profiles() -> list[str]:
    """Names of the shipped profiles (file stems in speedmatrix/profiles/)."""
    return sorted(p.stem for p in _PROFILES.glob("*.json"))


def profile_path(name: str | os.PathLike[str]) -> Path:
    """Path of a profile given by name (``"seed-h200"``) or by path to a JSON file."""
    p = Path(name)
    if p.suffix == ".json" and p.is_file():
        return p
    cand = _PROFILES / f"{name}.json"
    if not cand.is_file():
        raise ValueError(
            f"unknown sim profile {str(name)!r}; shipped: {', '.join(list_profiles())}"
        )
    return cand


def load_profile(name: str | os.PathLike[str]) -> dict[str, Any]:
    """The profile's JSON as a dict."""
    return json.loads(profile_path(name).read_text())


def sim_binary() -> Path:
    """Path of the `speedmatrix-sim` executable shipped inside the package
    ($SPEEDMATRIX_SIM_BINARY overrides it); it runs without the compiled core."""
    override = os.environ.get("SPEEDMATRIX_SIM_BINARY")
    path = (
        Path(override) if override else Path(__file__).resolve().parent / "_bin" / "speedmatrix-sim"
    )
    if not path.is_file():
        raise FileNotFoundError(
            f"the built-in engine binary is missing at {path}; reinstall speedmatrix "
            "(`pip install .`) or build in place with -DSPEEDMATRIX_INPLACE=ON"
        )
    return path


def _urlopen(url: str, timeout_s: float) -> Any:
    """``urllib.request.urlopen`` (the context manager of the answer)."""
    import urllib.request  # start-up: `speedmatrix --help` imports this module, not urllib's

    return urllib.request.urlopen(url, timeout=timeout_s)


FAULT_KINDS = ("http500", "malformed", "drop", "stall")


def _share(text: str) -> float:
    """A fault share from the command line: a number in [0, 1] (argparse type)."""
    return number_in(text, float, 0.0, 1.0, "a number", "a share in [0, 1]")


def _fault_args(faults: Mapping[str, float]) -> list[str]:
    _check_fault_sum(faults)
    args: list[str] = []
    for kind, share in faults.items():
        kind = kind.replace("_", "")
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}: use {', '.join(FAULT_KINDS)}")
        args += [f"--fault-{kind}", repr(float(share))]
    return args


def _engine_env(api_key: str | None) -> dict[str, str] | None:
    if not api_key:
        return None
    return {**os.environ, "SPEEDMATRIX_SIM_API_KEY": api_key}


def _check_fault_sum(shares: Mapping[str, float]) -> None:
    total = sum(float(v) for v in shares.values())
    if total > 1.0 + 1e-9:
        raise SimError(
            f"the fault shares add up to {total:g}; a request gets at most one fault, so "
            "they must add up to 1 or less"
        )


def _url_host(host: str) -> str:
    """host as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def _fmt_value(v: Any) -> str:
    return v if isinstance(v, str) and not v.startswith(("{", "[")) else json.dumps(v)


class Sim:
    """Runs `speedmatrix-sim` in a child process for the life of the object (or `with` block).

    profile: a shipped profile name or a path to a JSON profile.
    flavour: "sglang" or "vllm" (metric names, owned_by, error shapes); None = the profile's.
    port: 0 picks a free port. unpaced: emit tokens as fast as the sockets take them.
    stamp: add "sm_t_ns" (CLOCK_MONOTONIC send time) to every chunk.
    faults: shares of requests given a fault at random, keys "http500", "malformed",
        "drop", "stall" (values 0..1); seed makes them reproducible.
    overrides: profile fields to override, {"fixed_itl_ms": 10, ...}.
    host: the numeric address to bind, IPv4 or IPv6 ("::1").
    reasoning_tokens: chat replies' first N tokens are reasoning (``delta.reasoning_content``
        and ``usage.completion_tokens_details.reasoning_tokens``); reasoning_hidden: reported
        but never streamed, as a server that hides its thinking.
    """

    def __init__(
        self,
        profile: str | os.PathLike[str] = "seed-h200",
        flavour: str | None = None,
        port: int = 0,
        unpaced: bool = False,
        stamp: bool = False,
        faults: Mapping[str, float] | None = None,
        overrides: Mapping[str, Any] | None = None,
        *,
        seed: int | None = None,
        extra_args: Sequence[str] = (),
        start_timeout_s: float = 10.0,
        start: bool = True,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        reasoning_tokens: int = 0,
        reasoning_hidden: bool = False,
    ) -> None:
        self.profile = str(profile)
        self.host = host
        self.port: int = port
        self.url: str = ""
        self._proc: subprocess.Popen[str] | None = None
        # --watch-stdin: the engine exits when our end of its stdin pipe closes, so it
        # never outlives this process, even one that is killed.
        args = [
            str(sim_binary()),
            "--profile",
            str(profile_path(profile)),
            "--port",
            str(port),
            "--host",
            host,
            "--watch-stdin",
        ]
        if flavour:
            args += ["--flavour", flavour]
        if unpaced:
            args.append("--unpaced")
        if stamp:
            args.append("--stamp")
        args += _fault_args(faults or {})
        args += _reasoning_args(reasoning_tokens, reasoning_hidden)
        if seed is not None:
            args += ["--seed", str(int(seed))]
        for k, v in (overrides or {}).items():
            args += ["--set", f"{k}={_fmt_value(v)}"]
        args += list(extra_args)
        self.args = args
        #: the key the engine wants (passed in its environment, never on its command line)
        self.api_key = api_key
        self._timeout = start_timeout_s
        if start:
            self.start()

    # --- lifecycle ---
    def start(self) -> Sim:
        if self._proc is not None:
            return self
        self._proc = subprocess.Popen(
            self.args,
            env=_engine_env(self.api_key),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # Ctrl-C in a notebook reaches us, not the child
        )
        line = self._read_listen_line()
        self.port = int(line.rsplit(":", 1)[1])
        self.url = f"http://{_url_host(self.host)}:{self.port}"
        # Keep draining the pipes so the child never blocks on a full one.
        self._stderr_tail: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                with _urlopen(self.url + "/health", 2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or self._proc.poll() is not None:
                self.stop()
                raise SimError("speedmatrix-sim started but /health does not answer")
            time.sleep(0.02)
        return self

    def _read_listen_line(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        result: list[str] = []

        def read() -> None:
            assert self._proc is not None and self._proc.stdout is not None
            result.append(self._proc.stdout.readline())

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(self._timeout)
        line = result[0].strip() if result else ""
        if not line.startswith(_LISTEN_PREFIX):
            err = ""
            if not line:  # end of its stdout: the engine is exiting; its stderr says why
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=5)
            if self._proc.poll() is not None and self._proc.stderr is not None:
                err = self._proc.stderr.read().strip()
            self.stop()
            raise SimError(f"speedmatrix-sim did not start: {err or line or 'no listening line'}")
        return line

    def _drain(self) -> None:
        proc = self._proc
        if proc is None or proc.stderr is None:
            return
        for line in proc.stderr:
            self._stderr_tail = (self._stderr_tail + [line])[-50:]

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """Stops the engine (SIGTERM, then SIGKILL). Returns its exit status."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        return proc.returncode

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> Sim:  # noqa: PYI034 - Sim is not meant to be subclassed
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:  # never leave an orphan behind
        with contextlib.suppress(Exception):  # interpreter shutdown: modules may be gone
            self.stop(timeout_s=1.0)

    # --- queries ---
    def get_json(self, path: str, timeout_s: float = 10.0) -> Any:
        with _urlopen(self.url + path, timeout_s) as r:
            return json.loads(r.read())

    def state(self) -> dict[str, Any]:
        """GET /sim/state: running, waiting, KV use, cache counters, tokens sent, profile."""
        return self.get_json("/sim/state")

    def trace(self, last: int | None = None, since_ns: int | None = None) -> list[dict[str, int]]:
        """GET /sim/trace: the recent decode steps [{t_ns, batch, kv_tokens, step_ns, ...}]."""
        q = []
        if last is not None:
            q.append(f"last={int(last)}")
        if since_ns is not None:
            q.append(f"since_ns={int(since_ns)}")
        return self.get_json("/sim/trace" + ("?" + "&".join(q) if q else ""))

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Waits until nothing is running or waiting. Returns False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            s = self.state()
            if s["running"] == 0 and s["waiting"] == 0 and s["frontend"] == 0:
                return True
            time.sleep(0.02)
        return False


def _reasoning_args(tokens: int, hidden: bool) -> list[str]:
    args = ["--reasoning-tokens", str(int(tokens))] if tokens else []
    return [*args, "--reasoning-hidden"] if hidden else args


def add_engine_flags(ap: argparse.ArgumentParser) -> None:
    """The flags `speedmatrix sim` passes through to the binary: pacing, stamps, faults.
    Shared by this module's parser and the `sim` subcommand of speedmatrix.cli."""
    ap.add_argument(
        "--unpaced", action="store_true", help="emit tokens as fast as the sockets take them"
    )
    ap.add_argument(
        "--stamp", action="store_true", help='add "sm_t_ns" (the send time) to every chunk'
    )
    for kind in FAULT_KINDS:
        ap.add_argument(
            f"--fault-{kind}",
            type=_share,
            default=0.0,
            metavar="P",
            help=f"share of generation requests given the {kind} fault (0..1)",
        )
    ap.add_argument("--seed", type=int, help="seed of the fault draws (reproducible faults)")
    ap.add_argument(
        "--reasoning-tokens",
        type=int,
        default=0,
        metavar="N",
        help="chat replies' first N tokens are reasoning: streamed as "
        "delta.reasoning_content, reported in usage.completion_tokens_details",
    )
    ap.add_argument(
        "--reasoning-hidden",
        action="store_true",
        help="test mode: report the reasoning tokens in the usage without streaming them "
        "(a server that thinks in silence)",
    )
    ap.add_argument(
        "--api-key",
        help="require this key (Authorization: Bearer) on the API paths; also "
        "$SPEEDMATRIX_SIM_API_KEY",
    )


def engine_flag_args(a: argparse.Namespace) -> list[str]:
    """The binary's arguments for the flags added by add_engine_flags."""
    args: list[str] = []
    if a.unpaced:
        args.append("--unpaced")
    if a.stamp:
        args.append("--stamp")
    shares = {k: getattr(a, f"fault_{k}") for k in FAULT_KINDS}
    args += _fault_args({k: v for k, v in shares.items() if v})
    if a.seed is not None:
        args += ["--seed", str(a.seed)]
    return args + _reasoning_args(a.reasoning_tokens, a.reasoning_hidden)


def main(argv: Sequence[str] | None = None) -> int:
    """`speedmatrix sim`: runs the built-in engine in the foreground until Ctrl-C."""
    ap = argparse.ArgumentParser(prog="speedmatrix sim", description="Run the built-in engine.")
    ap.add_argument(
        "--profile",
        default="seed-h200",
        help=f"one of {', '.join(list_profiles())} or a .json path",
    )
    ap.add_argument("--port", type=port_arg, default=8000)
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    ap.add_argument("--flavour", choices=["sglang", "vllm"], default=None)
    add_engine_flags(ap)
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a profile field"
    )
    ap.add_argument("--list", action="store_true", help="list the shipped profiles and exit")
    a = ap.parse_args(list(argv) if argv is not None else None)
    if a.list:
        for name in list_profiles():
            print(f"{name:12s} {load_profile(name).get('description', '')}")
        return 0
    try:
        args = [
            str(sim_binary()),
            "--profile",
            str(profile_path(a.profile)),
            "--port",
            str(a.port),
            "--host",
            a.host,
        ]
    except (ValueError, FileNotFoundError) as e:
        print(f"speedmatrix sim: {e}", file=sys.stderr)
        return 2
    if a.flavour:
        args += ["--flavour", a.flavour]
    try:
        args += engine_flag_args(a)
    except SimError as e:
        print(f"speedmatrix sim: {e}", file=sys.stderr)
        return 2
    for kv in a.set:
        args += ["--set", kv]
    # --watch-stdin: the engine exits when this process's end of its stdin pipe closes, so
    # no death of this process (SIGKILL included) can leave it running with the port.
    args.append("--watch-stdin")
    return _serve(args, _engine_env(a.api_key))


#: the signals that stop `speedmatrix sim` (a user's Ctrl-C, `timeout`, `docker stop`,
#: systemd, CI cancellation, a closed terminal)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _serve(args: list[str], env: dict[str, str] | None) -> int:
    """Runs the engine in the foreground until it ends or a stop signal comes; returns 0 when
    a signal stopped it cleanly (a service's normal end), else its own status.

    The stop signals do not raise here: their handler records the first one and sends the
    engine SIGTERM (or, when it comes before the engine's Popen has returned, the code below
    does right after), then the blocking wait simply returns when the engine has exited. An
    exception raised by the handler could land anywhere (inside Popen, between two lines) and
    turn a clean stop into an "interrupted" exit; this way there is one outcome. A second
    signal takes the engine down at once (SIGKILL) and exits 128 + its number.
    """
    state: dict[str, Any] = {"proc": None, "signal": None, "termed": False}

    def stop(signum: int, frame: object) -> None:
        proc = state["proc"]
        if state["signal"] is not None:
            if proc is not None:
                with contextlib.suppress(OSError):
                    proc.kill()
            os.write(2, b"speedmatrix sim: second signal; exiting now\n")
            os._exit(128 + signum)
        state["signal"] = signum
        if proc is not None and not state["termed"]:
            state["termed"] = True
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGTERM)

    old: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        old = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, env=env)
        state["proc"] = proc
        if state["signal"] is not None and not state["termed"]:
            # the signal came while Popen was starting the engine
            state["termed"] = True
            proc.send_signal(signal.SIGTERM)
        code = proc.wait()  # PEP 475: a handled signal does not interrupt it
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if state["signal"] is None:
        return 128 - code if code < 0 else code  # the engine ended by itself (or was killed)
    # stopped by us: its own SIGTERM handler exits 0; killed by our SIGTERM before it had
    # installed that handler (a signal during its start-up) is a clean stop as well
    return 0 if code in (0, -signal.SIGTERM) else (128 - code if code < 0 else code)


if __name__ == "__main__":
    sys.exit(main())
