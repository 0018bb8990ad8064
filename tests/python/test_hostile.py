"""A hostile or broken server met by the discovery client (speedmatrix.http): every answer
ends in a one-line SpeedmatrixError of a clear kind, in bounded memory and time, and the
API key neither follows a redirect nor comes back in an error message (issue 14)."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time

import pytest
from speedmatrix import http as smhttp
from speedmatrix.errors import SpeedmatrixError

KEY = "sk-hostile-test-4b7c9d"


class RawServer:
    """Answers every connection on 127.0.0.1 with ``handler(conn, request_bytes)``."""

    def __init__(self, handler):
        self.handler = handler
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[bytes] = []
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        with conn:
            conn.settimeout(5)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    part = conn.recv(65536)
                    if not part:
                        return
                    data += part
                self.requests.append(data)
                self.handler(conn, data)
            except OSError:
                pass

    def close(self):
        self._stop = True
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _answer(status: str, body: bytes, headers: dict | None = None) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    for k, v in (headers or {}).items():
        head += f"{k}: {v}\r\n"
    return head.encode() + b"\r\n" + body


def _client(server: RawServer, timeout_s: float = 2.0) -> smhttp.HttpClient:
    return smhttp.HttpClient(server.url, api_key=KEY, timeout_s=timeout_s)


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert isinstance(exc, SpeedmatrixError)
    assert "\n" not in text and KEY not in text
    return text


def test_a_redirect_to_another_port_is_not_followed_and_the_key_does_not_travel():
    with RawServer(lambda c, r: c.sendall(_answer("200 OK", b'{"data": []}'))) as other:

        def redirect(conn, req):
            loc = f"{other.url}/v1/models"
            conn.sendall(_answer("302 Found", b"", {"Location": loc}))

        with RawServer(redirect) as server, pytest.raises(smhttp.HttpError) as info:
            _client(server).get_json("/v1/models")
        assert "not followed" in _one_line(info.value)
        assert other.requests == []  # nothing, Authorization least of all, reached it


def test_a_401_that_echoes_the_key_prints_no_key():
    body = json.dumps({"error": {"message": f"bad key Bearer {KEY} for user"}}).encode()
    with (
        RawServer(lambda c, r: c.sendall(_answer("401 Unauthorized", body))) as server,
        pytest.raises(smhttp.AuthError) as info,
    ):
        _client(server).get_json("/v1/models")
    text = _one_line(info.value)
    assert "<redacted>" in text and "refused" in text


@pytest.mark.parametrize(
    "payload, needle",
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", "not HTTP"),
        (b"\x00\x01\x02\xff" * 64, "not HTTP"),
        (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (10 << 20) + b"\r\n\r\n", "64 KiB"),
        (
            b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(500)) + b"\r\n",
            "broken HTTP",
        ),
        (b"", "without answering"),
    ],
    ids=["ssh-banner", "binary", "10MB-header", "500-headers", "closed"],
)
def test_non_http_answers_are_one_line_connect_errors(payload, needle):
    def handler(conn, req):
        try:
            conn.sendall(payload)
        except OSError:
            pass

    with RawServer(handler) as server:
        t0 = time.monotonic()
        with pytest.raises(smhttp.ConnectError) as info:
            _client(server).get_json("/v1/models")
    assert needle in _one_line(info.value)
    assert time.monotonic() - t0 < 5


def _endless(conn, req):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
    chunk = b"x" * 65536
    try:
        while True:
            conn.sendall(chunk)
    except OSError:
        pass


def test_an_endless_body_is_cut_at_the_bound():
    with RawServer(_endless) as server, pytest.raises(smhttp.ConnectError) as info:
        _client(server, timeout_s=20).get_json("/v1/models")
    assert "over" in _one_line(info.value)


def test_a_huge_declared_body_is_refused_before_reading():
    def huge(conn, req):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 536870912\r\n\r\n" + b"{" * 1000)

    with (
        RawServer(huge) as server,
        pytest.raises(smhttp.ConnectError, match="536,870,912 bytes") as info,
    ):
        _client(server).get_json("/v1/models")
    _one_line(info.value)


def test_a_trickling_body_is_bounded_in_time():
    def trickle(conn, req):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        try:
            for _ in range(100):
                conn.sendall(b" ")
                time.sleep(0.1)
        except OSError:
            pass

    with RawServer(trickle) as server:
        t0 = time.monotonic()
        with pytest.raises(smhttp.ConnectError, match="did not end within") as info:
            _client(server, timeout_s=0.5).get_json("/v1/models")
    _one_line(info.value)
    assert time.monotonic() - t0 < 3


def test_a_gzip_answer_is_read_and_a_gzip_bomb_is_bounded():
    body = gzip.compress(b'{"data": [{"id": "m"}]}')
    ok = _answer("200 OK", body, {"Content-Encoding": "gzip"})
    with RawServer(lambda c, r: c.sendall(ok)) as server:
        assert _client(server).get_json("/v1/models") == {"data": [{"id": "m"}]}
    bomb = gzip.compress(b" " * (64 << 20))  # 64 MiB of spaces in ~64 KiB
    with (
        RawServer(
            lambda c, r: c.sendall(_answer("200 OK", bomb, {"Content-Encoding": "gzip"}))
        ) as s,
        pytest.raises(smhttp.ConnectError, match="over") as info,
    ):
        _client(s).get_json("/v1/models")
    _one_line(info.value)


def test_an_html_page_says_so():
    page = b"<!doctype html><html><body>Welcome to nginx!</body></html>"
    ans = _answer("200 OK", page, {"Content-Type": "text/html"})
    with (
        RawServer(lambda c, r: c.sendall(ans)) as server,
        pytest.raises(smhttp.HttpError, match="HTML page") as info,
    ):
        _client(server).get_json("/v1/models")
    _one_line(info.value)


def test_a_429_with_a_short_retry_after_is_waited_for_and_a_long_one_is_not():
    calls: list[float] = []

    def limited(conn, req):
        calls.append(time.monotonic())
        if len(calls) == 1:
            conn.sendall(_answer("429 Too Many Requests", b"slow down", {"Retry-After": "1"}))
        else:
            conn.sendall(_answer("200 OK", b"{}"))

    with RawServer(limited) as server:
        assert _client(server).get_json("/v1/models") == {}
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.9  # Retry-After honoured

    def long_wait(conn, req):
        calls.append(time.monotonic())
        conn.sendall(_answer("429 Too Many Requests", b"", {"Retry-After": "3600"}))

    calls.clear()
    with (
        RawServer(long_wait) as server,
        pytest.raises(smhttp.HttpError, match="Retry-After 3600") as info,
    ):
        _client(server).get_json("/v1/models")
    _one_line(info.value)
    assert len(calls) == 1  # not hammered, not waited for an hour


def test_a_url_of_another_scheme_is_a_speedmatrix_error():
    with pytest.raises(SpeedmatrixError, match="not an http"):
        smhttp.HttpClient("ftp://example.com/models")


def _peak_bytes(fn) -> int:
    """Peak Python allocation while ``fn`` runs (bytes objects included)."""
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_a_gzip_bomb_and_an_endless_body_stay_within_the_cap_in_memory():
    # Inflated step by step with the output capped: a decoder that inflates a whole chunk
    # (httpx's own) would hold ~64 MiB from one 64 KiB chunk of this bomb.
    bomb = gzip.compress(b" " * (64 << 20))
    cap = smhttp.MAX_BODY_BYTES

    def expect_over(server):
        def run():
            with pytest.raises(smhttp.ConnectError, match="over"):
                _client(server, timeout_s=20).get_json("/v1/models")

        return run

    answer = _answer("200 OK", bomb, {"Content-Encoding": "gzip"})
    with RawServer(lambda c, r: c.sendall(answer)) as server:
        assert _peak_bytes(expect_over(server)) < cap + (8 << 20)
    with RawServer(_endless) as server:
        assert _peak_bytes(expect_over(server)) < cap + (8 << 20)


def test_headers_that_trickle_are_bounded_by_the_timeout_in_total():
    def trickle(conn, req):
        try:
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
                conn.sendall(bytes([byte]))
                time.sleep(0.05)
        except OSError:
            pass

    with RawServer(trickle) as server:
        t0 = time.monotonic()
        with pytest.raises(smhttp.ConnectError, match="no answer within") as info:
            _client(server, timeout_s=0.5).get_json("/v1/models")
    _one_line(info.value)
    assert time.monotonic() - t0 < 3  # each read got only the time left, not 0.5 s afresh


@pytest.mark.parametrize(
    "payload, needle",
    [
        (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (80 << 10) + b"\r\n\r\n{}", "64 KiB"),
        (b"HTTP/1.1 200 OK\r\nContent-Type: appl", "in the answer's headers"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}", "broke off"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 5\r\n\r\nabcde", "corrupt"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\n{}", "'br'"),
    ],
    ids=["80KiB-line", "cut-in-headers", "cut-in-body", "corrupt-gzip", "brotli"],
)
def test_broken_http_answers_are_one_line_connect_errors(payload, needle):
    with (
        RawServer(lambda c, r: c.sendall(payload)) as server,
        pytest.raises(smhttp.ConnectError) as info,
    ):
        _client(server).get_json("/v1/models")
    assert needle in _one_line(info.value)


@pytest.mark.parametrize("other", ["https://127.0.0.1:{port}/x", "http://127.0.0.1:1/x"])
def test_an_absolute_url_of_another_scheme_or_port_gets_no_request(other):
    with RawServer(lambda c, r: c.sendall(_answer("200 OK", b"{}"))) as server:
        with pytest.raises(smhttp.ConnectError, match="not the server's own address") as info:
            _client(server).get_json(other.format(port=server.port))
        assert _client(server).get_json(f"{server.url}/x") == {}  # its own origin: asked
    _one_line(info.value)
    assert len(server.requests) == 1


def test_connections_are_kept_alive_between_requests_and_closed_by_close():
    connections: list[int] = []

    def keep_alive(conn, req):
        connections.append(1)
        body = b'{"ok": true}'
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        data = req
        while True:
            conn.sendall(head + body)
            data = data[data.index(b"\r\n\r\n") + 4 :]
            while b"\r\n\r\n" not in data:
                part = conn.recv(65536)
                if not part:
                    return
                data += part

    with RawServer(keep_alive) as server, _client(server) as client:
        for _ in range(3):
            assert client.get_json("/v1/models") == {"ok": True}
        assert len(connections) == 1 and len(server.requests) == 1  # one connection
        client.close()
        assert client.get_json("/v1/models") == {"ok": True}  # usable after close
        assert len(connections) == 2


def test_the_http_library_is_imported_on_the_first_request_only():
    import subprocess
    import sys

    code = (
        "import sys, speedmatrix.cli, speedmatrix.http, speedmatrix.adapters; "
        "print(sorted(m for m in ('httpx', 'httpcore', 'h11') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"  # `speedmatrix --help` does not pay for it


def test_the_environments_proxy_is_used_and_no_proxy_bypasses_it(monkeypatch):
    # as urllib did before httpx (and libcurl does for the cells): http_proxy, no_proxy
    for var in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    with (
        RawServer(lambda c, r: c.sendall(_answer("200 OK", b'{"via": "proxy"}'))) as proxy,
        RawServer(lambda c, r: c.sendall(_answer("200 OK", b'{"via": "direct"}'))) as server,
    ):
        monkeypatch.setenv("http_proxy", proxy.url)
        assert _client(server).get_json("/v1/models") == {"via": "proxy"}
        assert proxy.requests[0].startswith(f"GET {server.url}/v1/models HTTP/1.1".encode())
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        assert _client(server).get_json("/v1/models") == {"via": "direct"}
        monkeypatch.setenv("http_proxy", "socks5://127.0.0.1:1")
        with pytest.raises(smhttp.ConnectError, match="not http") as info:
            smhttp.HttpClient("http://llm.invalid:8000").get_json("/v1/models")
        _one_line(info.value)


def test_a_connection_reset_before_or_during_the_answer_is_one_line():
    import struct

    def reset_after(data):
        def handler(conn, req):
            conn.sendall(data)
            time.sleep(0.05)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

        return handler  # closing with linger 0 sends RST

    cases = [
        (b"", "reset the connection"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{", "broke off"),
    ]
    for data, needle in cases:
        with RawServer(reset_after(data)) as server, pytest.raises(smhttp.ConnectError) as info:
            _client(server).get_json("/v1/models")
        assert needle in _one_line(info.value), str(info.value)


@pytest.mark.parametrize("key", ["sk-caf\u00e9", "sk-a\nInjected: 1", "sk-a b", "sk-\x00"])
def test_an_api_key_a_header_cannot_carry_is_one_line_without_the_key(key):
    with pytest.raises(SpeedmatrixError, match="cannot carry") as info:
        smhttp.HttpClient("http://127.0.0.1:1", api_key=key)
    assert key not in str(info.value) and "\n" not in str(info.value)
