"""Discovery and engine adapters against recorded discovery answers (tests/data/discovery),
served by an in-process HTTP server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from seed import seed_over_capacity
from speedmatrix import http as smhttp
from speedmatrix.adapters import (
    Adapter,
    MetricsSpec,
    ModelNotServedError,
    OutputControl,
    Target,
    TokenizeSpec,
    discover,
    get_adapter,
    normalise_url,
    parse_prometheus,
    read_load,
    register_adapter,
    registered_adapters,
    unregister_adapter,
)
from speedmatrix.adapters.base import Capacity, split_version, strip_credentials
from speedmatrix.errors import TargetError

DATA = Path(__file__).resolve().parents[1] / "data" / "discovery"


@contextlib.contextmanager
def start_sim(flavour: str = "sglang", profile: str = "seed-h200", *extra: str):
    """The built-in engine of the installed package on 127.0.0.1 (port 0)."""
    from speedmatrix.sim import Sim

    with Sim(profile, flavour=flavour, unpaced=True, extra_args=extra) as sim:
        yield sim.url


# ---- an in-process server answering from a route table ------------------------------------
class FakeServer:
    """``routes``: ``"METHOD /path"`` → ``{"status", "json" | "text"}`` or a callable
    ``(body: dict | None, headers) -> (status, payload)`` (payload: dict/list → JSON, str → text).
    Unknown routes answer 404. ``api_key`` makes every route want ``Bearer <key>``."""

    def __init__(self, routes: dict[str, Any], api_key: str | None = None) -> None:
        self.routes = routes
        self.api_key = api_key
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out at once

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                path = self.path.split("?", 1)[0]
                server.requests.append((method, path, dict(self.headers), body))
                auth = self.headers.get("Authorization")
                if server.api_key and auth != f"Bearer {server.api_key}":
                    status, payload = 401, {"error": {"message": "Invalid API key"}}
                else:
                    status, payload = server.answer(method, path, body, self.headers)
                if isinstance(payload, str):
                    data, ctype = payload.encode(), "text/plain; version=0.0.4"
                else:
                    data, ctype = json.dumps(payload).encode(), "application/json"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def answer(self, method: str, path: str, body: Any, headers: Any) -> tuple[int, Any]:
        route = self.routes.get(f"{method} {path}")
        if route is None:
            return 404, {"detail": "Not Found"}
        if callable(route):
            return route(body, headers)
        return route.get("status", 200), route["json"] if "json" in route else route["text"]

    def bodies(self, method: str, path: str) -> list[Any]:
        return [b for m, p, _h, b in self.requests if (m, p) == (method, path)]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lookup(data: dict, dotted: str) -> Any:
    value: Any = data
    for part in dotted.split("."):
        value = None if value is None else value[part]
    return value


# ---- recorded answers, one file per scenario ----------------------------------------------
RECORDED = sorted(DATA.glob("*/*.json"))
ENGINES = {"sglang", "vllm", "llamacpp", "tgi", "trtllm", "lmdeploy", "ollama", "generic"}


def test_every_engine_has_recorded_answers():
    assert ENGINES <= {p.parent.name for p in RECORDED}


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_recorded_discovery(path: Path):
    case = json.loads(path.read_text())
    kwargs = dict(case.get("discover", {}))
    with FakeServer(case["routes"]) as server:
        if "raises" in case:
            with pytest.raises(TargetError) as info:
                discover(server.url, **kwargs)
            assert type(info.value).__name__ == case["raises"]
            for text in case["message"]:
                assert text in str(info.value)
            return
        target = discover(server.url, **kwargs)
        found = target.to_dict()
        for key, want in case["expect"].items():
            if isinstance(want, str):
                want = want.replace("{url}", server.url)
            assert lookup(found, key) == want, key
        for text in case.get("warnings_contain", []):
            assert any(text in w for w in target.warnings), (text, target.warnings)
        if "load" in case:
            assert target.read_load() == case["load"]
            assert read_load(target) == (case["load"]["running"], case["load"]["waiting"])
        elif not target.metrics.available:
            assert read_load(target) is None
        for route, fields in case.get("requests_contain", {}).items():
            bodies = server.bodies(*route.split(" ", 1))
            assert bodies and all(b.items() >= fields.items() for b in bodies), bodies
        if path.parent.name in ENGINES:
            assert target.engine == path.parent.name
        back = Target.from_dict(json.loads(json.dumps(target.to_dict())), api_key="k")
        assert back == target and back.api_key == "k"
        assert target.probed[0] == "/v1/models"
        if target.tokenize is not None:
            assert target.tokenize.path in target.probed


def test_seed_capacity_is_probed_and_overrides_are_given():
    case = json.loads((DATA / "sglang" / "seed_h200.json").read_text())
    with FakeServer(case["routes"]) as server:
        target = discover(server.url, overrides={"kv_tokens": 1_000_000, "max_running": 64})
    meta = target.capacity_meta()
    assert meta["kv_tokens"] == {
        "value": 1_000_000,
        "source": "given",
        "detail": "given by the user",
    }
    assert meta["max_running"]["source"] == "given"
    assert meta["context_length"]["source"] == "probed"
    assert meta["context_length"]["value"] == 131072


def test_unknown_override_is_an_error():
    with pytest.raises(ValueError, match="overrides: unknown key 'kv'"):
        discover("http://127.0.0.1:1", overrides={"kv": 1})


def test_bad_override_value_names_it():
    case = json.loads((DATA / "generic" / "plain_openai.json").read_text())
    with FakeServer(case["routes"]) as server, pytest.raises(ValueError, match="kv_tokens: -5"):
        discover(server.url, overrides={"kv_tokens": -5})


def test_engine_override_skips_detection():
    case = json.loads((DATA / "generic" / "plain_openai.json").read_text())
    with FakeServer(case["routes"]) as server:
        target = discover(server.url, overrides={"engine": "vllm", "engine_version": "9.9"})
    assert target.engine == "vllm"
    assert target.version == "9.9"
    assert target.output.ignore_eos


def test_unreachable_server_says_so():
    port = closed_port()
    with pytest.raises(smhttp.ConnectError) as info:
        discover(f"http://127.0.0.1:{port}")
    assert str(info.value) == f"cannot reach http://127.0.0.1:{port}/v1/models: connection refused"


def test_api_key_is_sent_and_never_shown():
    case = json.loads((DATA / "vllm" / "v1_dp2.json").read_text())
    with FakeServer(case["routes"], api_key="sk-secret-123") as server:
        with pytest.raises(smhttp.AuthError, match="wants an API key"):
            discover(server.url)
        target = discover(server.url, api_key="sk-secret-123")
        assert all(
            h.get("Authorization") == "Bearer sk-secret-123"
            for _m, _p, h, _b in server.requests[1:]
        )
    assert target.api_key == "sk-secret-123"
    for text in (repr(target), json.dumps(target.to_dict()), repr(target.client())):
        assert "sk-secret-123" not in text
    assert target.engine == "vllm"


def test_credentials_in_url_are_stripped_from_target():
    case = json.loads((DATA / "generic" / "plain_openai.json").read_text())
    with FakeServer(case["routes"]) as server:
        url = server.url.replace("http://", "http://user:pw@") + "/v1/"
        target = discover(url)
    assert target.url == server.url
    assert "pw" not in json.dumps(target.to_dict())


def test_several_models_warn_and_pick_the_first():
    case = json.loads((DATA / "errors" / "model_not_served.json").read_text())
    with FakeServer(case["routes"]) as server:
        target = discover(server.url)
        chosen = discover(server.url, model="b")
    assert target.model == "a"
    assert any("several models (a, b)" in w for w in target.warnings)
    assert chosen.model == "b"


def test_model_not_served_message():
    exc = ModelNotServedError("x", ["a", "b"])
    assert str(exc) == "model 'x' is not served; the server offers: a, b"
    assert isinstance(exc, TargetError)


# ---- user adapters ------------------------------------------------------------------------
class ToyAdapter(Adapter):
    name = "toy"
    owned_by = ("toy-engine",)
    metrics = MetricsSpec(running="toy_running", waiting="toy_waiting", path="/stats")
    tokenize = (TokenizeSpec("/count", "openai"),)
    output = OutputControl(forced=True, ignore_eos=True)

    def probe(self, ctx):
        info = ctx.get_dict("/toy/info")
        if info is None:
            return None
        return {"version": info["v"], "kv_tokens": info["pool"], "context_length": 4096}


def test_register_adapter_without_touching_the_package():
    routes = {
        "GET /v1/models": {"json": {"data": [{"id": "toy-1", "owned_by": "toy-engine"}]}},
        "GET /toy/info": {"json": {"v": "0.1", "pool": 50000}},
        "GET /stats": {"text": "toy_running 1\ntoy_waiting 0\n"},
        "POST /count": {"json": {"count": 2}},
    }
    register_adapter(ToyAdapter)
    try:
        assert registered_adapters()[0] is ToyAdapter
        with FakeServer(routes) as server:
            target = discover(server.url)
            assert target.engine == "toy"
            assert target.version == "0.1"
            assert target.kv_tokens == 50000
            assert target.capacity["kv_tokens"].source == "probed"
            assert target.metrics.available
            assert target.read_load() == {"running": 1.0, "waiting": 0.0, "kv_usage": None}
            assert target.tokenize.path == "/count"
    finally:
        unregister_adapter("toy")
    assert "toy" not in [a.name for a in registered_adapters()]


def test_adapters_argument_replaces_the_registry():
    case = json.loads((DATA / "sglang" / "seed_h200.json").read_text())
    with FakeServer(case["routes"]) as server:
        target = discover(server.url, adapters=[ToyAdapter])
    assert target.engine == "generic"  # the SGLang adapter was not offered


def test_a_broken_adapter_does_not_stop_discovery():
    class Broken(Adapter):
        name = "broken"

        def probe(self, ctx):
            raise KeyError("oops")

    case = json.loads((DATA / "generic" / "plain_openai.json").read_text())
    with FakeServer(case["routes"]) as server:
        target = discover(server.url, adapters=[Broken])
    assert target.engine == "generic"
    assert any("'broken' failed" in w for w in target.warnings)


def test_register_rejects_non_adapters():
    with pytest.raises(TypeError):
        register_adapter(dict)
    with pytest.raises(ValueError, match="unknown engine 'nope'"):
        get_adapter("nope")


# ---- pieces -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url, base",
    [
        ("http://h:8000", "http://h:8000"),
        ("http://h:8000/", "http://h:8000"),
        ("http://h:8000/v1", "http://h:8000"),
        ("http://h:8000/v1/", "http://h:8000"),
        ("h:8000", "http://h:8000"),
    ],
)
def test_normalise_url(url, base):
    assert normalise_url(url) == base


def test_strip_credentials():
    assert strip_credentials("https://u:p@host:1/x?y=1") == "https://host:1/x?y=1"
    assert strip_credentials("http://host") == "http://host"


@pytest.mark.parametrize(
    "text, version, commit",
    [
        ("0.5.6.post3.dev9265+g05c584c44", "0.5.6.post3.dev9265+g05c584c44", "05c584c44"),
        ("0.11.0", "0.11.0", None),
        (None, None, None),
    ],
)
def test_split_version(text, version, commit):
    assert split_version(text) == (version, commit)


def test_parse_prometheus():
    text = (
        "# HELP x y\n# TYPE a gauge\n"
        'a{l="1",m="q\\"uote"} 2.5\n'
        "b 3 1700000000000\n"
        'c{le="+Inf"} +Inf\n'
        "\n"
    )
    samples = parse_prometheus(text)
    assert samples[0] == ("a", {"l": "1", "m": 'q"uote'}, 2.5)
    assert samples[1] == ("b", {}, 3.0)
    assert samples[2][2] == float("inf")
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse_prometheus("<html>nope</html>")


def test_metrics_reduce_sums_ranks_and_takes_max_usage():
    spec = MetricsSpec(running="r", waiting="w", kv_usage="k")
    samples = [
        ("r", {"rank": "0"}, 2.0),
        ("r", {"rank": "1"}, 3.0),
        ("k", {}, 0.2),
        ("k", {}, 0.7),
        ("other", {}, 9.0),
    ]
    assert spec.reduce(samples) == {"running": 5.0, "waiting": None, "kv_usage": 0.7}


@pytest.mark.parametrize(
    "control, api, want",
    [
        (OutputControl(), "completions", {"max_tokens": 8}),
        (
            OutputControl(forced=True, ignore_eos=True, min_tokens_field="min_tokens"),
            "completions",
            {"max_tokens": 8, "ignore_eos": True, "min_tokens": 8},
        ),
        (
            OutputControl(True, True, "min_new_tokens", ("max_completion_tokens",)),
            "chat",
            {"max_tokens": 8, "max_completion_tokens": 8, "ignore_eos": True, "min_new_tokens": 8},
        ),
    ],
)
def test_output_control_fields(control, api, want):
    assert control.fields(api, 8) == want


@pytest.mark.parametrize(
    "spec, answer, count, ids",
    [
        (TokenizeSpec("/tokenize"), {"tokens": [1, 2], "count": 2}, 2, [1, 2]),
        (TokenizeSpec("/tokenize", "llamacpp"), {"tokens": [1, 2, 3]}, 3, [1, 2, 3]),
        (TokenizeSpec("/tokenize", "tgi"), [{"id": 4, "text": "a"}], 1, [4]),
        (TokenizeSpec("/v1/encode", "lmdeploy"), {"input_ids": [5, 6], "length": 2}, 2, [5, 6]),
    ],
)
def test_tokenize_parse(spec, answer, count, ids):
    assert spec.parse(answer) == (count, ids)


def test_tokenize_requests_per_style():
    assert TokenizeSpec("/t").request("m", "hi") == {"prompt": "hi", "model": "m"}
    assert TokenizeSpec("/t", "llamacpp").request("m", "hi") == {
        "content": "hi",
        "add_special": True,
    }
    assert TokenizeSpec("/t", "tgi").request(None, "hi") == {"inputs": "hi"}
    assert TokenizeSpec("/t", "lmdeploy").request(None, "hi") == {"input": "hi"}
    msgs = [{"role": "user", "content": "hi"}]
    assert TokenizeSpec("/t", messages=True).request("m", messages=msgs)["messages"] == msgs
    with pytest.raises(ValueError, match="cannot tokenize chat"):
        TokenizeSpec("/t", "tgi").request(None, messages=msgs)


def test_target_defaults_and_capacity_rules():
    t = Target("http://h:1/")
    assert t.url == "http://h:1"
    assert t.kv_tokens is None and t.capacity["kv_tokens"] == Capacity(None, "missing")
    t.set_capacity("kv_tokens", 10, "given")
    assert t.capacity_meta()["kv_tokens"] == {"value": 10, "source": "given"}
    with pytest.raises(ValueError, match="unknown capacity"):
        t.set_capacity("kv", 1, "given")
    assert t.endpoint("chat") == "http://h:1/v1/chat/completions"
    assert t.base_url == "http://h:1"
    assert t.metrics_url is None
    assert t.engine_meta()["name"] == "generic"


def test_http_error_messages():
    body = '{"error": {"message": "This model\'s maximum context length is 8192 tokens"}}'
    err = smhttp.HttpError("POST", "http://h/v1/completions", 400, body)
    assert str(err) == (
        "POST http://h/v1/completions answered HTTP 400: "
        "This model's maximum context length is 8192 tokens"
    )
    assert smhttp.error_message('{"error": "Input validation error", "error_type": "x"}') == (
        "Input validation error"
    )
    assert smhttp.error_message('{"object": "error", "message": "bad"}') == "bad"
    assert smhttp.error_message("plain") == "plain"


def test_http_client_rejects_non_http_urls():
    with pytest.raises(ValueError, match="not an http"):
        smhttp.HttpClient("ftp://x")


def test_http_timeout_is_a_connect_error():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts, never answers
    try:
        client = smhttp.HttpClient(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.3)
        with pytest.raises(smhttp.ConnectError, match="timed out|no answer within"):
            client.get_json("/v1/models")
    finally:
        listener.close()


# ---- the built-in engine ------------------------------------------------------------------
@pytest.mark.parametrize("flavour", ["sglang", "vllm"])
def test_discovery_of_the_built_in_engine(flavour):
    from speedmatrix.sim import load_profile

    profile = load_profile("seed-h200")
    with start_sim(flavour) as url:
        target = discover(url)
        assert target.read_load() is not None
        assert read_load(target) == (0.0, 0.0)
    assert target.engine == flavour
    assert target.model == profile["model"]
    assert target.kv_tokens == profile["kv_tokens"]
    assert target.context_length == profile["context_length"]
    assert target.capacity["kv_tokens"].source == "probed"
    assert target.metrics.available and target.tokenize is not None
    assert target.info["simulated"] is True
    if flavour == "sglang":
        assert target.max_running == profile["max_running"]
        assert target.version == profile["version"]


def test_seed_plan_against_the_built_in_engine():
    from speedmatrix.matrix import Matrix
    from speedmatrix.plan import plan

    with start_sim("sglang") as url:
        target = discover(url)
    p = plan(Matrix.preset("seed"), target)
    over = {(c.label, c.concurrency) for c in p if c.status == "over_capacity"}
    assert over == seed_over_capacity()


def test_url_credentials_become_basic_auth():
    routes = {"GET /v1/models": {"json": {"data": []}}}
    with FakeServer(routes) as server:
        client = smhttp.HttpClient(server.url.replace("http://", "http://ann:s%40cret@"))
        assert client.get_json("/v1/models") == {"data": []}
        assert "s%40cret" not in repr(client) and "ann" not in client.base_url
    assert server.requests[0][2]["Authorization"] == "Basic YW5uOnNAY3JldA=="


# ---- what the report is told about the model and the engine ------------------------------
def _seed_routes(**server_info: Any) -> dict:
    case = json.loads((DATA / "sglang" / "seed_h200.json").read_text())
    routes = case["routes"]
    for path in ("GET /server_info", "GET /get_server_info"):
        routes[path]["json"].update(server_info)
    return routes


def test_sglang_model_path_and_engine_facts_reach_the_meta():
    with FakeServer(_seed_routes()) as server:
        target = discover(server.url)
    meta = target.target_meta("completions")
    assert meta["model"] == "muse-glimmer"  # the served name stays what requests use
    assert meta["model_path"] == "meta-models/Muse-Glimmer-30B"
    assert (meta["model_name"], meta["model_name_source"]) == ("Muse-Glimmer-30B", "model_path")
    eng = target.engine_meta()
    assert eng["model_path"] == "meta-models/Muse-Glimmer-30B"
    assert eng["tp_size"] == 1 and eng["dtype"] == "auto" and eng["simulated"] is False
    assert eng["quantization"] is None  # dtype "auto" names no precision
    assert eng["info"]["attention_backend"] == "fa3"
    assert eng["sources"]["version"] == "probed" and eng["sources"]["commit"] == "probed"
    assert eng["sources"]["repository"] == "default"  # the adapter's project, not probed
    assert eng["repository"] == "github.com/sgl-project/sglang"


@pytest.mark.parametrize(
    "dtype, shown", [("bfloat16", "BF16"), ("float16", "FP16"), ("half", "FP16"), ("auto", None)]
)
def test_sglang_dtype_is_the_precision_when_there_is_no_quantization(dtype, shown):
    with FakeServer(_seed_routes(dtype=dtype)) as server:
        target = discover(server.url)
    assert target.quantization == shown
    assert target.engine_meta()["dtype"] == dtype
    with FakeServer(_seed_routes(dtype=dtype, quantization="fp8")) as server:
        assert discover(server.url).quantization == "fp8"


def test_sglang_model_path_from_get_model_info_when_server_info_lacks_it():
    routes = _seed_routes()
    for path in ("GET /server_info", "GET /get_server_info"):
        del routes[path]["json"]["model_path"]
    routes["GET /get_model_info"] = {
        "json": {"model_path": "/data/models/Muse-Glimmer-30B/", "is_generation": True}
    }
    with FakeServer(routes) as server:
        target = discover(server.url)
    assert target.model_path == "/data/models/Muse-Glimmer-30B/"
    assert target.target_meta("chat")["model_name"] == "Muse-Glimmer-30B"


def test_vllm_model_root_is_the_model_path():
    case = json.loads((DATA / "vllm" / "v1_dp2.json").read_text())
    with FakeServer(case["routes"]) as server:
        target = discover(server.url)
    meta = target.target_meta("completions")
    assert meta["model_path"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert meta["model_name"] == "Llama-3.1-8B-Instruct"


def test_served_name_is_the_model_name_when_no_path_is_known():
    case = json.loads((DATA / "generic" / "plain_openai.json").read_text())
    with FakeServer(case["routes"]) as server:
        target = discover(server.url)
    meta = target.target_meta("completions")
    assert meta["model_path"] is None
    assert meta["model_name"] == target.model and meta["model_name_source"] == "served_model"


def test_given_model_name_and_engine_facts_are_recorded_as_given():
    given = {
        "model_name": "Muse Glimmer 30B (BF16)",
        "engine_version": "0.5.7",
        "commit": "abc1234",
        "backend": "rocm",
        "build": "rocm-6.4",
        "repository": "github.com/me/sglang-fork",
        "quantization": "FP8",
    }
    with FakeServer(_seed_routes()) as server:
        target = discover(server.url, overrides=given)
    meta = target.target_meta("completions")
    assert (meta["model_name"], meta["model_name_source"]) == ("Muse Glimmer 30B (BF16)", "given")
    eng = target.engine_meta()
    assert (
        eng["version"],
        eng["commit"],
        eng["backend"],
        eng["build"],
        eng["repository"],
        eng["quantization"],
    ) == ("0.5.7", "abc1234", "rocm", "rocm-6.4", "github.com/me/sglang-fork", "FP8")
    for key in ("version", "commit", "backend", "build", "repository", "quantization"):
        assert eng["sources"][key] == "given", key
    assert eng["sources"]["name"] == "probed"


def test_engine_name_no_adapter_knows_only_names_the_engine():
    case = json.loads((DATA / "generic" / "plain_openai.json").read_text())
    with FakeServer(case["routes"]) as server:
        target = discover(server.url, overrides={"engine": "mlc-llm"})
        known = discover(server.url, overrides={"engine": "vllm"})
    assert target.engine == "generic"  # detected as usual
    eng = target.engine_meta()
    assert (eng["name"], eng["adapter"], eng["sources"]["name"]) == ("mlc-llm", "generic", "given")
    assert known.engine_meta()["name"] == "vllm" and known.engine_meta()["adapter"] == "vllm"
    assert known.engine_meta()["sources"]["name"] == "given"


@pytest.mark.parametrize("flavour", ["sglang", "vllm"])
def test_built_in_engine_says_it_is_simulated(flavour):
    with start_sim(flavour) as url:
        target = discover(url)
    eng = target.engine_meta()
    assert eng["simulated"] is True and eng["info"]["simulated"] is True
    assert eng["backend"] == "simulated"
    assert eng["repository"] is None  # not SGLang's or vLLM's code
    assert target.target_meta("completions")["model_path"]
