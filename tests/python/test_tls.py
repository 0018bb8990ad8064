"""TLS for the C++ client core (issue 2): the streaming requests of a cell and its
/metrics sampler, against a small HTTPS server run in this process with a self-signed
certificate made for the test (subject and SAN: IP 127.0.0.1 only).

  - ca_file = the certificate: requests stream and /metrics is sampled;
  - default verification (the system's CAs): every request fails as error kind "tls"
    and every scrape fails;
  - the right CA but a host name the certificate does not name (localhost): "tls";
  - tls_verify = False: both work again, whoever the certificate names;
  - Authorization: Bearer reaches the server over TLS, on POST and on GET /metrics.
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import shutil
import ssl
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from speedmatrix._native import _core

API_KEY = "sk-tls-test-7f3a"
TOKENS = 3  # text chunks per answer
# Per rank: the sampler adds up label sets ("sum"), so it reads 3 + 4.
METRICS = '# TYPE sm_running gauge\nsm_running{rank="0"} 3\nsm_running{rank="1"} 4\n'


def _make_cert(dirpath: Path) -> tuple[Path, Path]:
    """A self-signed certificate for IP 127.0.0.1 (CN and SAN) and its key, as PEM."""
    cert, key = dirpath / "cert.pem", dirpath / "key.pem"
    openssl = shutil.which("openssl")
    if openssl:
        subprocess.run(
            [
                openssl,
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        return cert, key
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        pytest.skip("needs the openssl command or the cryptography package to make a certificate")
    k = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    c = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(k.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(k, hashes.SHA256())
    )
    cert.write_bytes(c.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        k.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, key


def _sse() -> list[bytes]:
    """An OpenAI completions stream: TOKENS text chunks, a finish reason, [DONE]."""
    events = [{"choices": [{"index": 0, "text": "x", "finish_reason": None}]}] * TOKENS
    events.append({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})
    return [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real server
    disable_nagle_algorithm = True  # headers and body go out at once

    def log_message(self, *args) -> None:  # quiet
        pass

    def _seen(self) -> None:
        self.server.seen.append(
            (self.command, self.path, self.headers.get("Authorization"), self.connection.version())
        )  # the TLS version: over TLS

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._seen()
        events = _sse()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(sum(map(len, events))))
        self.end_headers()
        for e in events:  # a stream, not one write: 10 ms between events
            self.wfile.write(e)
            self.wfile.flush()
            time.sleep(0.01)

    def do_GET(self) -> None:
        self._seen()
        body = METRICS.encode() if self.path == "/metrics" else b"not found\n"
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _TlsServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, ctx: ssl.SSLContext) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ctx = ctx
        self.seen: list[tuple] = []
        self.handshake_failures = 0

    def handle_error(self, request, client_address) -> None:
        pass  # a stream cancelled at the window's end breaks off our writes: expected

    def finish_request(self, request, client_address) -> None:
        # The handshake runs on the connection's own thread, so a client that rejects
        # the certificate never blocks the accept loop.
        try:
            tls = self.ctx.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            self.handshake_failures += 1
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cert, key = _make_cert(tmp_path_factory.mktemp("tls"))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv = _TlsServer(ctx)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    srv.cert = cert
    srv.port = srv.server_address[1]
    yield srv
    srv.shutdown()
    srv.server_close()


def _cell(server, host: str = "127.0.0.1", **tls):
    """A 0.35 s cell of 2 streams with /metrics sampled every 50 ms; returns the result
    and what the server saw during it."""
    base = f"https://{host}:{server.port}"
    spec = _core.CellSpec()
    spec.url = base + "/v1/completions"
    spec.api_key = API_KEY
    spec.bodies = [json.dumps({"prompt": "hi", "max_tokens": TOKENS, "stream": True})]
    spec.concurrency = 2
    spec.duration_s = 0.35
    spec.connect_timeout_s = 5
    spec.idle_timeout_s = 5
    spec.metrics_url = base + "/metrics"
    spec.metric_names = ["sm_running"]
    spec.metrics_interval_s = 0.05
    for k, v in tls.items():
        setattr(spec, k, v)
    # The previous cell's last requests were cancelled mid-flight; the server may log them
    # a moment later. Start counting once its log has been still for a while.
    first, still_since = len(server.seen), time.monotonic()
    while time.monotonic() - still_since < 0.3:
        time.sleep(0.05)
        if len(server.seen) != first:
            first, still_since = len(server.seen), time.monotonic()
    failures = server.handshake_failures
    res = _core.CellRunner(spec).run()
    assert not res.fatal_error
    return res, server.seen[first:], server.handshake_failures - failures


def _window(res) -> dict:
    req = res.requests
    w = np.asarray(req["phase"]) == 1
    return {k: np.asarray(v)[w] for k, v in req.items()}


def _assert_streams(res, seen) -> None:
    req = _window(res)
    done = req["outcome"] == 1
    # 2 slots, about 50 ms per answer: many requests, every one that ended in time was
    # whole (the last ones are cancelled at the window's end, not failed).
    assert done.sum() >= 4, req
    assert set(req["outcome"]) <= {1, 2}
    assert set(req["error_kind"]) == {""}
    assert np.all(req["output_tokens"][done] == TOKENS)
    assert set(np.asarray(req["finish_reason"])[done]) == {"stop"}
    assert np.all(req["http_status"][done] == 200)
    # /metrics over TLS: sampled through the window, every scrape read (3 + 4 summed).
    met = res.metrics
    assert met["failures"] == 0
    assert len(met["t_ns"]) >= 3
    assert np.all(np.asarray(met["values"])[:, 0] == 7.0)
    # The key reached the server, encrypted: every POST and every scrape carried it.
    posts = [s for s in seen if s[0] == "POST"]
    gets = [s for s in seen if s[0] == "GET"]
    assert len(posts) >= done.sum() and len(gets) >= len(met["t_ns"])
    for method, path, auth, tls_version in seen:
        assert auth == f"Bearer {API_KEY}", (method, path, auth)
        assert tls_version and tls_version.startswith("TLS"), tls_version
    assert {s[1] for s in posts} == {"/v1/completions"} and {s[1] for s in gets} == {"/metrics"}


def _assert_tls_failures(res, seen, why: str) -> None:
    req = _window(res)
    failed = req["outcome"] == 3
    # The closed loop kept trying, and every request failed at the handshake.
    assert failed.sum() >= 2
    assert set(req["outcome"]) <= {2, 3}
    assert set(req["error_kind"][failed]) == {"tls"}, set(req["error_kind"])
    assert np.all(req["output_tokens"] == 0)
    # The message says why (libcurl's words, through the core).
    msgs = [str(m).lower() for m in req["error_message"][failed]]
    assert all(why in m for m in msgs), msgs[0]
    # No scrape got through either; the server never saw an HTTP request.
    assert res.metrics["failures"] >= 1 and len(res.metrics["t_ns"]) == 0
    assert seen == []


def test_ca_file_verifies_the_server(server):
    res, seen, _ = _cell(server, ca_file=str(server.cert))
    _assert_streams(res, seen)


def test_default_verification_rejects_a_self_signed_certificate(server):
    res, seen, handshakes_failed = _cell(server)  # tls_verify on, the system's CAs
    _assert_tls_failures(res, seen, "certificate")
    assert handshakes_failed >= 1  # the client refused the certificate in the handshake


def test_the_host_name_is_verified(server):
    # The right CA, but the certificate names 127.0.0.1, not localhost.
    # (The client may check the name after the handshake: it then hangs up unheard.)
    res, seen, _ = _cell(server, host="localhost", ca_file=str(server.cert))
    _assert_tls_failures(res, seen, "localhost")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_tls_verify_off_accepts_any_certificate(server, host):
    res, seen, _ = _cell(server, host=host, tls_verify=False)
    _assert_streams(res, seen)
