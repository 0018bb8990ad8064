"""One client configuration for discovery, the prompt builder and the core's streams (issue
25, issue 19 item 3): a URL's ``user:password@`` and ``SSL_CERT_FILE`` reach every request,
not discovery's alone, and the credentials reach no file and no terminal."""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
import time
import types

import pytest
from cliproc import run_cli
from secrets_check import secrets_found
from speedmatrix import sweep
from speedmatrix.http import ClientConfig, ConnectError, HttpClient
from test_tls import _make_cert

USER, PASSWORD = "bench", "pa:ss@W0rd-7c1e"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
QUOTED = "pa%3Ass%40W0rd-7c1e"


# ---- the config itself (fast) --------------------------------------------------------------
def test_the_config_takes_the_urls_credentials_and_the_environments_ca(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    cfg = ClientConfig.make(
        f"http://{USER}:{QUOTED}@127.0.0.1:1", environ={"SSL_CERT_FILE": str(ca)}
    )
    assert cfg.basic_auth == (USER, PASSWORD)
    assert cfg.authorization == BASIC
    assert (cfg.ca_file, cfg.ca_source) == (str(ca), "SSL_CERT_FILE")
    assert PASSWORD in cfg.secrets and BASIC.removeprefix("Basic ") in cfg.secrets
    # --ca-file wins over the environment; a key wins over Basic auth
    other = ClientConfig.make(
        f"http://{USER}:{QUOTED}@h", "sk-1", ca_file="/x.pem", environ={"SSL_CERT_FILE": str(ca)}
    )
    assert (other.ca_file, other.ca_source, other.authorization) == (
        "/x.pem",
        "--ca-file",
        "Bearer sk-1",
    )
    # an SSL_CERT_FILE that names no file is left to OpenSSL, as before
    assert (
        ClientConfig.make("http://h", environ={"SSL_CERT_FILE": str(tmp_path / "no")}).ca_file
        is None
    )
    for text in (repr(cfg), repr(other), json.dumps(cfg.describe()), json.dumps(other.describe())):
        assert PASSWORD not in text and "sk-1" not in text and QUOTED not in text


def test_a_cell_spec_gets_the_configs_credentials_and_tls():
    from speedmatrix._native import _core

    def spec_of(cfg):
        spec = _core.CellSpec()
        cfg.apply(spec)
        return spec

    s = spec_of(
        ClientConfig.make(f"https://{USER}:{QUOTED}@h", environ={"SSL_CERT_FILE": __file__})
    )
    assert s.headers == [f"Authorization: {BASIC}"] and s.ca_file == __file__ and s.tls_verify
    s = spec_of(ClientConfig.make("https://h", "sk-2", insecure=True, environ={}))
    assert s.headers == [] and s.api_key == "***" and s.tls_verify is False and s.ca_file == ""


def test_the_sweeps_cells_use_the_targets_config():
    # what Sweep._spec builds for the core: the config discovery used, not a global
    def spec(cfg):
        fake = types.SimpleNamespace(
            facts=types.SimpleNamespace(metric_names=list),
            target=types.SimpleNamespace(
                metrics_url=None,
                client_config=cfg,
                endpoint=lambda api: "https://127.0.0.1:1/v1/completions",
            ),
        )
        cell = types.SimpleNamespace(api="completions", request_idle_timeout_s=30)
        return sweep.Sweep._spec(fake, cell, 1, [b"{}"], [], 1.0)

    assert spec(ClientConfig(ca_file="/etc/ssl/x.pem")).ca_file == "/etc/ssl/x.pem"
    assert spec(ClientConfig(insecure=True)).tls_verify is False
    assert spec(ClientConfig(basic_auth=(USER, PASSWORD))).headers == [f"Authorization: {BASIC}"]


# ---- a loopback server that wants Basic auth, over http or https ---------------------------
class _OpenAI(http.server.BaseHTTPRequestHandler):
    """A tiny OpenAI-compatible server: /v1/models, and /v1/completions answering a
    non-streaming request with usage (a word a token) and a streaming one with max_tokens
    chunks 5 ms apart. Every request without the right Basic auth gets 401."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out at once

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorised(self) -> bool:
        auth = self.headers.get("Authorization")
        self.server.seen.append((self.command, self.path, auth))
        if auth != BASIC:
            self._send(401, b'{"error": {"message": "credentials wanted"}}')
            return False
        return True

    def do_GET(self) -> None:
        if not self._authorised():
            return
        if self.path == "/v1/models":
            data = {"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "t"}]}
            self._send(200, json.dumps(data).encode())
        else:
            self._send(404, b'{"error": {"message": "not found"}}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if not self._authorised():
            return
        if self.path != "/v1/completions":
            self._send(404, b'{"error": {"message": "not found"}}')
            return
        prompt = body.get("prompt", "")
        n_in = len(prompt.split()) if isinstance(prompt, str) else len(prompt)
        n_out = min(int(body.get("max_tokens") or 16), 64)
        usage = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
        if not body.get("stream"):
            choice = {"index": 0, "text": "x", "finish_reason": "length"}
            self._send(200, json.dumps({"choices": [choice], "usage": usage}).encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [{"choices": [{"index": 0, "text": " x", "finish_reason": None}]}] * n_out
        events.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        events.append({"choices": [], "usage": usage})
        try:
            for e in [*(f"data: {json.dumps(e)}\n\n" for e in events), "data: [DONE]\n\n"]:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(e), e.encode()))
                self.wfile.flush()
                time.sleep(0.005)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # cancelled at the window's end


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, ctx: ssl.SSLContext | None) -> None:
        super().__init__(("127.0.0.1", 0), _OpenAI)
        self.ctx = ctx
        self.seen: list[tuple] = []

    def handle_error(self, request, client_address) -> None:
        pass

    def finish_request(self, request, client_address) -> None:
        if self.ctx is None:
            super().finish_request(request, client_address)
            return
        try:
            tls = self.ctx.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return _make_cert(tmp_path_factory.mktemp("tls"))


def _serve(cert=None):
    ctx = None
    if cert is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*cert)
    srv = _Server(ctx)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _run(url: str, out, env: dict | None = None):
    import os

    args = ["run", "--url", url, "--contexts", "64", "--concurrency", "1", "--duration", "1s"]
    args += ["--max-output", "16", "--out", str(out)]
    return run_cli(*args, timeout=120, env={**os.environ, **(env or {})})


def _check_run(res, srv, out) -> None:
    assert res.returncode == 0, res.stderr
    doc = json.loads((out / "run.json").read_text())
    assert doc["cells"] and {c["status"] for c in doc["cells"]} == {"valid"}, doc["cells"]
    posts = [s for s in srv.seen if s[0] == "POST"]
    assert len(posts) >= 5  # calibration and the cell's streams
    assert all(auth == BASIC for _, _, auth in srv.seen), {s[2] for s in srv.seen}
    assert "@" not in doc["meta"]["target"]["url"]
    assert secrets_found(out, [PASSWORD, QUOTED, BASIC.removeprefix("Basic ")]) == []
    for text in (res.stdout, res.stderr):
        assert PASSWORD not in text and QUOTED not in text


@pytest.mark.e2e
def test_basic_auth_in_the_url_reaches_calibration_and_every_stream(tmp_path):
    srv = _serve()
    try:
        port = srv.server_address[1]
        _check_run(
            _run(f"http://{USER}:{QUOTED}@127.0.0.1:{port}", tmp_path / "run"),
            srv,
            tmp_path / "run",
        )
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.e2e
def test_a_ca_only_in_ssl_cert_file_reaches_every_stream(tmp_path, cert):
    srv = _serve(cert)
    try:
        port = srv.server_address[1]
        url = f"https://{USER}:{QUOTED}@127.0.0.1:{port}"
        out = tmp_path / "run"
        _check_run(_run(url, out, {"SSL_CERT_FILE": str(cert[0])}), srv, out)
        assert (
            json.loads((out / "run.json").read_text())["meta"]["run"]["tls"]["ca_source"]
            == "SSL_CERT_FILE"
        )
        # without it the system's CAs refuse the certificate, in discovery already
        with pytest.raises(ConnectError, match="TLS"):
            HttpClient(url, config=ClientConfig.make(url, environ={})).get_json("/v1/models")
    finally:
        srv.shutdown()
        srv.server_close()
