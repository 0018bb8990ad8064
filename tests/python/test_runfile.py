"""run.json and records on disk: atomic writes, the schema check, npz round trips."""

import json
import math
import os

import numpy as np
import pytest
from secrets_check import npz_strings, secrets_found
from speedmatrix import npzwrite, runfile
from speedmatrix.runfile import (
    SCHEMA,
    RunFileError,
    load_records,
    read_run,
    save_records,
    write_run,
)


def _cell(**kw):
    c = {
        "id": "decode-c8192-n4-r0",
        "phase": "decode",
        "context": 8192,
        "concurrency": 4,
        "status": "valid",
        "total_tok_s": 221.9,
        "per_request_tok_s": 55.6,
        "prompt_tok_s": None,
        "ttft_ms": 200.0,
        "tbt_ms": 18.0,
        "avg_active": 4.0,
        "completed": 0,
        "output_tokens": 6656,
        "measured_s": 30.0,
        "errors": {},
    }
    c.update(kw)
    return c


def _doc(*cells):
    return {"schema": SCHEMA, "meta": {"run": {"interrupted": False}}, "cells": list(cells)}


def test_round_trip_and_nan_becomes_null(tmp_path):
    doc = _doc(_cell(ttft_ms=float("nan"), tbt_ms=np.float64(17.5), completed=np.int64(3)))
    path = write_run(tmp_path, doc)
    assert path == tmp_path / "run.json"
    raw = json.loads(path.read_text())
    assert raw["cells"][0]["ttft_ms"] is None
    assert raw["cells"][0]["tbt_ms"] == 17.5 and raw["cells"][0]["completed"] == 3
    back = read_run(tmp_path)
    assert back["cells"][0]["output_tokens"] == 6656
    assert read_run(path)["schema"] == SCHEMA  # a path to the file works too


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    write_run(tmp_path, _doc(_cell()))
    before = (tmp_path / "run.json").read_text()
    with pytest.raises(TypeError):
        write_run(tmp_path, _doc(_cell(extra=object())))  # not JSON: nothing replaced
    assert (tmp_path / "run.json").read_text() == before
    write_run(tmp_path, _doc(_cell(), _cell(id="decode-c8192-n8-r0", concurrency=8)))
    assert len(read_run(tmp_path)["cells"]) == 2
    assert sorted(os.listdir(tmp_path)) == ["run.json"]


def test_write_redacts_launch_command_url_and_known_secrets(tmp_path):
    doc = _doc(_cell(reason="failed with key sk-abcdefghijkl0123"))
    doc["meta"]["run"]["launch_command"] = "sglang serve --api-key topsecret99 --port 8000"
    doc["meta"]["target"] = {"url": "http://h:8000/v1?api_key=urlsecret77"}
    doc["meta"]["note"] = "key given: knownsecret55"
    write_run(tmp_path, doc, secrets=["knownsecret55"])
    text = (tmp_path / "run.json").read_text()
    for s in ("topsecret99", "urlsecret77", "knownsecret55", "sk-abcdefghijkl0123"):
        assert s not in text
    assert "--port 8000" in text


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d.pop("schema"), "missing field 'schema'"),
        (lambda d: d.update(schema="speedmatrix.run/0"), "unsupported schema"),
        (lambda d: d.pop("cells"), "missing field 'cells'"),
        (lambda d: d["cells"][0].pop("tbt_ms"), "decode-c8192-n4-r0) is missing field 'tbt_ms'"),
        (lambda d: d["cells"][0].pop("status"), "missing field 'status'"),
        (lambda d: d["cells"][0].update(status="great"), "field 'status' is 'great'"),
        (lambda d: d["cells"][0].update(phase="warmup"), "field 'phase' is 'warmup'"),
        (lambda d: d["cells"][0].update(context="8k"), "field 'context' must be an integer"),
    ],
)
def test_schema_errors_name_the_problem(tmp_path, mutate, message):
    doc = _doc(_cell())
    mutate(doc)
    (tmp_path / "run.json").write_text(json.dumps(doc))
    with pytest.raises(RunFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_run(tmp_path)


def test_non_strict_only_needs_identity_fields(tmp_path):
    c = _cell()
    del c["tbt_ms"], c["errors"]
    (tmp_path / "run.json").write_text(json.dumps(_doc(c)))
    with pytest.raises(RunFileError):
        read_run(tmp_path)
    assert read_run(tmp_path, strict=False)["cells"][0]["context"] == 8192


def test_missing_folder_file_and_bad_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_run(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="run.json is missing"):
        read_run(tmp_path)
    (tmp_path / "run.json").write_text("{broken")
    with pytest.raises(RunFileError, match="not valid JSON"):
        read_run(tmp_path)


def test_records_round_trip(tmp_path):
    req = {
        "slot": np.arange(3, dtype=np.int32),
        "phase": np.array([0, 1, 1], np.uint8),
        "sent_ns": np.array([1, 2, -1], np.int64),
        "error_kind": ["", "http_500", ""],
        "finish_reason": ["length", "", ""],
    }
    ev = {
        "request": np.array([0, 1, 1], np.int32),
        "t_ns": np.array([5, 6, 7], np.int64),
        "tokens": np.array([1, 2, 1], np.int32),
        "server_ns": np.full(3, -1, np.int64),
    }
    met = {
        "names": ["sglang:num_running_reqs", "sglang:num_queue_reqs"],
        "t_ns": [10, 20],
        "values": [[1.0, 0.0], [2.0, float("nan")]],
        "failures": 2,
    }
    rel = save_records(tmp_path, "decode-c8192-n4-r0", req, ev, met)
    assert rel == "records/decode-c8192-n4-r0.npz"
    with np.load(tmp_path / rel, allow_pickle=False) as z:
        assert {
            "req_slot",
            "req_error_kind",
            "ev_t_ns",
            "met_names",
            "met_t_ns",
            "met_values",
        } <= set(z.files)
        assert z["req_error_kind"].dtype.kind == "U"
    back = load_records(tmp_path, rel)
    assert back["requests"]["error_kind"].tolist() == ["", "http_500", ""]
    assert back["requests"]["sent_ns"].dtype == np.int64
    assert back["events"]["tokens"].tolist() == [1, 2, 1]
    assert back["metrics"]["names"] == met["names"]
    assert back["metrics"]["values"].shape == (2, 2)
    assert math.isnan(back["metrics"]["values"][1, 1])
    assert back["metrics"]["failures"] == 2
    assert not [p for p in (tmp_path / "records").iterdir() if p.name.startswith(".")]


def test_records_without_metrics_and_missing_file(tmp_path):
    rel = save_records(tmp_path, "prefill-c8192-r0", {"slot": [0]}, {"t_ns": [1]}, None)
    back = load_records(tmp_path, rel)
    assert back["metrics"]["names"] == [] and back["metrics"]["values"].shape == (0, 0)
    with pytest.raises(FileNotFoundError, match="records file missing"):
        load_records(tmp_path, "records/none.npz")


def test_records_strings_are_redacted(tmp_path):
    key = "plain-KEY-without-shape-42"
    messages = [
        "",
        f"HTTP 401: Invalid API key {key}",
        "HTTP 400: bad header Authorization: Bearer tok-abc.def",
        "HTTP 403: --admin-api-key adminSecret99 required",
        "context length 131072 exceeded",
    ]
    req = {
        "slot": np.arange(5, dtype=np.int32),
        "error_message": messages,
        "error_kind": np.asarray(["", "http_401", "http_400", "http_403", "http_400"]),
    }
    rel = save_records(tmp_path, "decode-c64-n1-r0", req, {"t_ns": [1]}, None, secrets=[key])
    back = load_records(tmp_path, rel)["requests"]["error_message"].tolist()
    assert back == [
        "",
        "HTTP 401: Invalid API key <redacted>",
        "HTTP 400: bad header Authorization: Bearer <redacted>",
        "HTTP 403: --admin-api-key <redacted> required",
        "context length 131072 exceeded",
    ]
    assert secrets_found(tmp_path, [key, "tok-abc.def", "adminSecret99"]) == []


def test_the_secret_check_sees_inside_compressed_unicode_arrays(tmp_path):
    secret = "hidden-SECRET-in-utf32"
    np.savez_compressed(tmp_path / "x.npz", msg=np.asarray(["a" * 500 + secret] * 50))
    assert secret.encode() not in (tmp_path / "x.npz").read_bytes()  # why bytes are not enough
    hits = secrets_found(tmp_path, [secret])
    assert hits and "in array msg" in hits[0]
    assert any(secret in s for s in npz_strings(tmp_path))


def test_saved_records_load_as_numpys_own_savez_would(tmp_path):
    # the streamed writer against np.savez_compressed: every dtype and shape a cell saves
    arrays = {
        "req_sent_ns": np.arange(7, dtype=np.int64) * 1_000_003,
        "req_error": np.asarray(["", "HTTP 503: busy", "ü"], dtype=np.str_),
        "req_body": np.asarray([b"a", b"\x00\xff"], dtype=np.bytes_),
        "ev_ok": np.asarray([True, False, True]),
        "ev_empty": np.zeros(0, np.int32),
        "met_values": np.arange(12, dtype=np.float64).reshape(4, 3),
        "cell_window_start_ns": np.asarray(123456789012),
        "cell_fatal_error": np.asarray("none"),
    }
    ours, theirs = tmp_path / "ours.npz", tmp_path / "theirs.npz"
    npzwrite.savez_streamed(str(ours), arrays)
    np.savez_compressed(theirs, **arrays)  # type: ignore[arg-type]
    with np.load(ours, allow_pickle=False) as a, np.load(theirs, allow_pickle=False) as b:
        assert sorted(a.files) == sorted(b.files) == sorted(arrays)
        for k in arrays:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            assert np.array_equal(a[k], b[k]), k


def test_saving_a_large_cell_holds_no_copy_of_its_events(tmp_path):
    """1 M token events (the soak's 512-stream, 120 s cell had 3 M): numpy's savez wrote them
    in copies of up to 16 MiB (+17 MB at the end of that cell, issue 25), here one of the 8 MB
    t_ns column; the streamed writer in 1 MiB slices of the arrays themselves. numpy's and
    Python's allocations, traced."""
    import tracemalloc

    n = 1_000_000
    ev = {
        "request": np.arange(n, dtype=np.int32) % 512,
        "t_ns": np.arange(n, dtype=np.int64) * 40_000,
        "tokens": np.ones(n, np.int32),
    }
    tracemalloc.start()
    try:
        rel = runfile.save_records(tmp_path, "decode-c64-n512-r0", {"id": np.arange(6)}, ev)
        peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    assert peak_mb < 4, f"saving grew numpy's and Python's memory by {peak_mb:.1f} MB"
    with np.load(tmp_path / rel, allow_pickle=False) as z:
        assert np.array_equal(z["ev_t_ns"], ev["t_ns"])


def test_saving_pages_out_the_mapped_columns_it_has_written(tmp_path):
    """The core hands the spilled token events over as private mappings of its spill files;
    saving reads every page of them, which stayed resident (+23 MB at the end of the soak's
    cell). The save drops each written MiB from the resident set (MADV_PAGEOUT) and the
    columns still read back the same."""

    def rss_file_mb() -> float:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("RssFile")) / 1024

    N = 2_000_000  # a 16 MB column
    col = tmp_path / "spill.bin"
    with open(col, "wb") as f:
        np.arange(N, dtype=np.int64).tofile(f)
        f.flush()
        os.fsync(f.fileno())  # clean pages: a dirty one cannot be reclaimed before writeback
    mapped = np.memmap(col, dtype=np.int64, mode="c")  # MAP_PRIVATE, as the core maps
    assert npzwrite._external(mapped)
    assert not npzwrite._external(np.arange(3)) and not npzwrite._external(np.arange(9)[2:])
    assert int(mapped.sum()) == N * (N - 1) // 2  # every page resident
    before = rss_file_mb()
    rel = runfile.save_records(tmp_path, "c", {"id": np.arange(3)}, {"t_ns": mapped})
    dropped = before - rss_file_mb()
    if npzwrite._madvise is None or dropped < 1:
        probe = np.memmap(col, dtype=np.int64, mode="c")
        int(probe[:1024].sum())
        if npzwrite._madvise is None or npzwrite._madvise(probe.ctypes.data, 4096, 21) != 0:
            pytest.skip("this kernel has no MADV_PAGEOUT")
    assert dropped > 12, f"the save left {16 - dropped:.0f} of the column's 16 MB resident"
    with np.load(tmp_path / rel, allow_pickle=False) as z:
        assert np.array_equal(z["ev_t_ns"], np.arange(N, dtype=np.int64))
    assert np.array_equal(mapped[-3:], [N - 3, N - 2, N - 1])
