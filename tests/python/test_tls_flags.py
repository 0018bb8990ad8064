"""--ca-file and --insecure (issue 14) decide TLS for discovery and for the core's cells
alike: one ClientConfig (speedmatrix.http) is given to every HttpClient and applied to the
cell spec, so a CA that lets discovery through cannot leave every stream failing `tls`."""

from __future__ import annotations

import types

import pytest
from speedmatrix import http as smhttp
from speedmatrix import sweep
from test_tls import server  # noqa: F401 - the HTTPS server fixture (self-signed, 127.0.0.1)


def _get(server, config=None):  # noqa: F811
    url = f"https://127.0.0.1:{server.port}"
    return smhttp.HttpClient(url, timeout_s=5, config=config).get_text("/metrics")


def test_discovery_verifies_by_default_and_says_how_to_fix_it(server):  # noqa: F811
    with pytest.raises(smhttp.ConnectError, match="--ca-file FILE or --insecure"):
        _get(server)


def test_discovery_uses_the_ca_file_and_insecure(server):  # noqa: F811
    assert "sm_running" in _get(server, smhttp.ClientConfig.make(ca_file=str(server.cert)))
    assert "sm_running" in _get(server, smhttp.ClientConfig.make(insecure=True))


def test_discovery_reads_ssl_cert_file_as_the_standard_library_does(server, monkeypatch):  # noqa: F811
    # The standard library's default context (OpenSSL's default paths, which SSL_CERT_FILE
    # overrides), as with urllib before httpx: not httpx's own certifi bundle.
    monkeypatch.setenv("SSL_CERT_FILE", str(server.cert))
    assert "sm_running" in _get(server)


def _spec(config):
    fake = types.SimpleNamespace(
        facts=types.SimpleNamespace(metric_names=list),
        target=types.SimpleNamespace(
            metrics_url=None,
            client_config=config,
            endpoint=lambda api: "https://127.0.0.1:1/v1/completions",
        ),
    )
    cell = types.SimpleNamespace(api="completions", request_idle_timeout_s=30, client_threads=0)
    return sweep.Sweep._spec(fake, cell, 1, [b"{}"], [], 1.0)


def test_the_cells_get_the_same_choice():
    spec = _spec(smhttp.ClientConfig())
    assert spec.tls_verify is True and spec.ca_file == ""
    assert _spec(smhttp.ClientConfig.make(ca_file="/etc/ssl/x.pem")).ca_file == "/etc/ssl/x.pem"
    assert _spec(smhttp.ClientConfig.make(insecure=True)).tls_verify is False
