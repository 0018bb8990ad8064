"""Free-running sessions against the old lock step, on the built-in engine.

    PYTHONPATH=python python3 bench/sessions_free.py [--sessions 16] [--turns 4]
        [--context 1024] [--turn-tokens 64] [--think 0.1] [--profile seed-h200]

N sessions of T turns whose answers differ in length (session s answers 16 + s x 112 /
(N - 1) tokens: real answers are not all max_output long). Both modes run one cell with a
chain feed (`_core.ChainFeed`) and the same prompts:
  free       `speedmatrix.sessions.run_feeder`: each session's next turn is pushed as its
             own answer arrives and sent at its end + the think time;
  lock step  the old behaviour, emulated: turn k + 1 of every session is pushed only once
             turn k of every session finished, after the think time, so N prefills land
             at once and early sessions wait for the slowest.
It prints, per mode: later-turn TTFT (median, p90), turn-0 TTFT, output tok/s over the cell
(output tokens / (last end - first send)), the session span, and the send lateness p99
(sent - scheduled, later turns). A benchmark prints figures; it does not fail.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from speedmatrix import sessions
from speedmatrix._native import _core
from speedmatrix.sim import Sim


def run(url: str, model: str, args, free: bool) -> dict:
    n, turns = args.sessions, args.turns
    length = sessions.final_tokens(args.context, args.turn_tokens, 128, turns)
    pools = [[1000 + (s * 7919 + i * 31) % 50000 for i in range(length)] for s in range(n)]
    chat = sessions.Chat(pools, args.context, 0, 128, args.turn_tokens, turns)
    answer = [16 + s * 112 // max(n - 1, 1) for s in range(n)]

    def body_of(s: int, ids: list[int]) -> bytes:
        body = {"model": model, "prompt": ids, "max_tokens": answer[s], "stream": True}
        body.update(ignore_eos=True, return_token_ids=True)
        return json.dumps(body).encode()

    spec = _core.CellSpec()
    spec.url = url + "/v1/completions"
    spec.bodies = [body_of(s, ids) for s, ids in enumerate(chat.prompts)]
    spec.concurrency = n
    spec.duration_s = 300.0
    spec.steady_window = False
    spec.keep_output = True
    feed = _core.ChainFeed(n, turns, args.think)
    spec.chain = feed
    if free:
        feeder = threading.Thread(target=sessions.run_feeder, args=(feed, chat, body_of, {}))
    else:
        feeder = threading.Thread(
            target=sessions.run_lockstep_feeder, args=(feed, chat, body_of, {}, args.think)
        )
    feeder.start()
    res = _core.CellRunner(spec).run()
    feeder.join()
    req = res.requests
    turn = req["body"] // n
    ttft = (req["first_token_ns"] - req["sent_ns"]) / 1e6
    ok = req["outcome"] == 1
    later = ok & (turn >= 1)
    span_s = (req["done_ns"][ok].max() - req["sent_ns"][ok].min()) / 1e9
    late = (req["sent_ns"][later] - req["scheduled_ns"][later]) / 1e6
    return {
        "turn0_ttft_ms": float(np.median(ttft[ok & (turn == 0)])),
        "later_ttft_ms": float(np.median(ttft[later])),
        "later_ttft_p90_ms": float(np.percentile(ttft[later], 90)),
        "output_tok_s": float(req["output_tokens"][ok].sum()) / span_s,
        "span_s": span_s,
        "send_late_p99_ms": float(np.percentile(late, 99)),
        "completed": int(ok.sum()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--turn-tokens", type=int, default=64)
    p.add_argument("--think", type=float, default=0.1)
    p.add_argument("--profile", default="seed-h200")
    args = p.parse_args()
    for name, free in (("lock step", False), ("free", True)):
        # a fresh engine per mode: the other mode's prompts are not in its prefix cache
        with Sim(args.profile, flavour="vllm", overrides={"context_length": 1 << 16}) as sim:
            model = sim.get_json("/v1/models")["data"][0]["id"]
            r = run(sim.url, model, args, free)
            print(
                f"{name:10s} later-turn TTFT {r['later_ttft_ms']:7.1f} ms (p90 "
                f"{r['later_ttft_p90_ms']:7.1f})  turn-0 TTFT {r['turn0_ttft_ms']:7.1f} ms  "
                f"output {r['output_tok_s']:7.1f} tok/s  span {r['span_s']:5.2f} s  "
                f"send late p99 {r['send_late_p99_ms']:6.1f} ms  completed {r['completed']}"
            )


if __name__ == "__main__":
    main()
