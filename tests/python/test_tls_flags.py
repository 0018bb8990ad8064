"""--ca-file and --insecure (issue 14) decide TLS for discovery and for the core's cells
alike: speedmatrix.http.configure_tls is read by every HttpClient and by the cell spec, so
a CA that lets discovery through cannot leave every stream failing `tls`."""

from __future__ import annotations

import types

import pytest
from speedmatrix import http as smhttp
from speedmatrix import sweep
from test_tls import server  # noqa: F401 - the HTTPS server fixture (self-signed, 127.0.0.1)


@pytest.fixture(autouse=True)
def _reset_tls():
    yield
    smhttp.configure_tls()


def _get(server):  # noqa: F811
    return smhttp.HttpClient(f"https://127.0.0.1:{server.port}", timeout_s=5).get_text("/metrics")


def test_discovery_verifies_by_default_and_says_how_to_fix_it(server):  # noqa: F811
    with pytest.raises(smhttp.ConnectError, match="--ca-file FILE or --insecure"):
        _get(server)


def test_discovery_uses_the_ca_file_and_insecure(server):  # noqa: F811
    smhttp.configure_tls(ca_file=str(server.cert))
    assert "sm_running" in _get(server)
    smhttp.configure_tls(insecure=True)
    assert "sm_running" in _get(server)


def test_discovery_reads_ssl_cert_file_as_the_standard_library_does(server, monkeypatch):  # noqa: F811
    # The standard library's default context (OpenSSL's default paths, which SSL_CERT_FILE
    # overrides), as with urllib before httpx: not httpx's own certifi bundle.
    monkeypatch.setenv("SSL_CERT_FILE", str(server.cert))
    assert "sm_running" in _get(server)


def _spec():
    fake = types.SimpleNamespace(
        _endpoint=lambda: "https://127.0.0.1:1/v1/completions",
        api_key=None,
        matrix=types.SimpleNamespace(api="completions", request_idle_timeout_s=30),
        facts=types.SimpleNamespace(metric_names=list),
        target=types.SimpleNamespace(metrics_url=None),
    )
    return sweep.Sweep._spec(fake, 1, [b"{}"], [], 1.0)


def test_the_cells_get_the_same_choice():
    spec = _spec()
    assert spec.tls_verify is True and spec.ca_file == ""
    smhttp.configure_tls(ca_file="/etc/ssl/x.pem")
    assert _spec().ca_file == "/etc/ssl/x.pem"
    smhttp.configure_tls(insecure=True)
    assert _spec().tls_verify is False
