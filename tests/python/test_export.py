"""Open exports: cells.csv and the Parquet records load in pandas, pyarrow and DuckDB with the
numbers of run.json and the .npz records; run.json is checked against its shipped schema."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import speedmatrix
import synthetic
from speedmatrix import export, schema
from speedmatrix.report import write_report
from speedmatrix.results import load
from speedmatrix.runfile import load_records

# the folder holding the speedmatrix under test (the installed package in CI, the
# source tree in a developer's in-place build), for the CLI run as a subprocess
PY = str(Path(speedmatrix.__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("exp") / "run"
    shutil.copytree(synthetic.shared_run("full"), d)
    write_report(d, charts=False)
    return d


def test_report_writes_the_exports_beside_run_json(run_dir):
    for name in (export.CELLS_CSV, export.REQUESTS_PARQUET, export.TOKENS_PARQUET):
        assert (run_dir / name).is_file(), name


def test_cells_csv_has_the_figures_of_run_json(run_dir):
    doc = json.loads((run_dir / "run.json").read_text())
    csv = pd.read_csv(run_dir / export.CELLS_CSV)
    assert len(csv) == len(doc["cells"])
    by_id = csv.set_index("id")
    for c in doc["cells"]:
        row = by_id.loc[c["id"]]
        assert row["status"] == c["status"]
        for fig in ("total_tok_s", "per_request_tok_s", "ttft_ms", "prompt_tok_s"):
            want = c.get(fig)
            if want is None:
                assert pd.isna(row[fig]), (c["id"], fig)
            else:
                assert row[fig] == pytest.approx(want, rel=1e-12), (c["id"], fig)
        assert json.loads(row["flags"]) == c["flags"]


def test_parquet_records_equal_the_npz_records(run_dir):
    import pyarrow.parquet as pq

    req = pq.read_table(run_dir / export.REQUESTS_PARQUET).to_pandas()
    tok = pq.read_table(run_dir / export.TOKENS_PARQUET).to_pandas()
    doc = json.loads((run_dir / "run.json").read_text())
    with_records = [c for c in doc["cells"] if c.get("records")]
    assert with_records and set(req["cell"]) == {c["id"] for c in with_records}
    for c in with_records[:: max(1, len(with_records) // 6)]:
        rec = load_records(run_dir, c["records"])
        r = req[req["cell"] == c["id"]]
        for k, v in rec["requests"].items():
            if k in export.LABELS:  # written as labels: their codes are the record's
                name, labels = export.LABELS[k]
                codes = [labels.index(x) for x in r[name].astype(str)]
                assert codes == np.asarray(v).tolist(), (c["id"], k)
                continue
            assert np.array_equal(r[k].to_numpy(), np.asarray(v)), (c["id"], k)
        assert (r["phase"] == c["phase"]).all()  # the cell's phase, not overwritten
        t = tok[tok["cell"] == c["id"]]
        for k, v in rec["events"].items():
            assert np.array_equal(t[k].to_numpy(), np.asarray(v)), (c["id"], k)
        assert (r["context"] == c["context"]).all() and (r["concurrency"] == c["concurrency"]).all()


def test_duckdb_reads_the_same_numbers(run_dir):
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    n_req, n_tok = con.execute(
        f"SELECT (SELECT count(*) FROM '{run_dir / export.REQUESTS_PARQUET}'), "
        f"(SELECT sum(tokens) FROM '{run_dir / export.TOKENS_PARQUET}')"
    ).fetchone()
    run = load(run_dir)
    assert n_req == len(run.requests)
    events = [run.records(c)["events"] for c in run.cells["id"] if run.records(c)]
    assert n_tok == sum(int(np.sum(e["tokens"])) for e in events if e)
    top = con.execute(
        f"SELECT id, total_tok_s FROM read_csv_auto('{run_dir / export.CELLS_CSV}') "
        "WHERE total_tok_s IS NOT NULL ORDER BY total_tok_s DESC LIMIT 1"
    ).fetchone()
    best = run.cells.dropna(subset=["total_tok_s"]).sort_values("total_tok_s").iloc[-1]
    assert top[0] == best["id"] and top[1] == pytest.approx(best["total_tok_s"])


def test_a_run_without_records_exports_cells_and_empty_tables(tmp_path):
    d = tmp_path / "r"
    shutil.copytree(synthetic.shared_run("full"), d)
    shutil.rmtree(d / "records")
    doc = json.loads((d / "run.json").read_text())
    for c in doc["cells"]:
        c.pop("records", None)
    (d / "run.json").write_text(json.dumps(doc))
    paths = export.write_exports(d)
    import pyarrow.parquet as pq

    assert pq.read_table(d / export.REQUESTS_PARQUET).num_rows == 0
    assert len(pd.read_csv(paths[0])) == len(doc["cells"])


def test_shipped_schema_accepts_runs_and_names_the_first_problem(tmp_path):
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(schema.schema())
    doc = json.loads((synthetic.shared_run("full") / "run.json").read_text())
    assert schema.check(doc) is doc
    bad = json.loads(json.dumps(doc))
    bad["cells"][3]["status"] = "done"
    with pytest.raises(schema.RunSchemaError) as e:
        schema.check(bad, "x/run.json")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("x/run.json does not follow speedmatrix.run/1")
    assert "cells[3].status" in msg and "'done'" in msg
    bad = json.loads(json.dumps(doc))
    bad["cells"][0]["ttft_ms"] = "fast"
    with pytest.raises(schema.RunSchemaError, match=r"cells\[0\]\.ttft_ms"):
        schema.check(bad)


@pytest.mark.e2e  # the CLI in a subprocess
def test_report_command_on_a_bad_run_json_is_one_line(tmp_path):
    d = tmp_path / "r"
    shutil.copytree(synthetic.shared_run("full"), d)
    doc = json.loads((d / "run.json").read_text())
    doc["cells"][2]["concurrency"] = "eight"
    (d / "run.json").write_text(json.dumps(doc))
    res = subprocess.run(
        [sys.executable, "-m", "speedmatrix.cli", "report", str(d)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": PY},
    )
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "cells[2].concurrency" in lines[0], res.stderr
    assert not (d / "report.html").exists()


def test_coded_record_columns_read_back_as_labels(run_dir):
    import pyarrow.parquet as pq

    table = pq.read_table(run_dir / export.REQUESTS_PARQUET)
    req = table.to_pandas()
    assert set(req["outcome"].astype(str)) <= {"ok", "cancelled", "error", "pending"}
    assert "ok" in set(req["outcome"].astype(str))
    assert set(req["request_phase"].astype(str)) == {"warmup", "window"}
    assert set(req["phase"]) == {"prefill", "decode"}
    assert set(req["token_source"].astype(str)) <= {
        "none",
        "chunks",
        "usage_final",
        "usage_continuous",
    }
    for name in ("outcome", "request_phase", "token_source"):
        assert str(req[name].dtype) == "category", name
    duckdb = pytest.importorskip("duckdb")
    (n_ok,) = (
        duckdb.connect()
        .execute(f"SELECT count(*) FROM '{run_dir / export.REQUESTS_PARQUET}' WHERE outcome = 'ok'")
        .fetchone()
    )
    assert n_ok == int((req["outcome"] == "ok").sum()) > 0


def test_an_unknown_code_keeps_its_number_as_a_label():
    name, col = export.labelled("outcome", np.array([1, 3, 9, 1], np.uint8))
    assert name == "outcome" and col.to_pylist() == ["ok", "error", "9", "ok"]
    name, col = export.labelled("phase", np.array([], np.uint8))
    assert name == "request_phase" and col.to_pylist() == []


def test_the_parquet_export_holds_one_row_group_not_the_run(tmp_path):
    """A cell of 1 M token events (a 40 s window at 512 streams) is exported a row group at a
    time from the compressed records file: the process must not grow by a copy of its rows
    (before: the whole run's rows as Arrow tables with their cell columns, the Parquet file
    in memory and a bytes copy of it, ~300 MB for 2 M events). Peak RSS (VmHWM, reset first) over the
    RSS before; the rows must still equal the records'."""
    import pyarrow.parquet as pq
    from speedmatrix.runfile import save_records

    d = tmp_path / "r"
    shutil.copytree(synthetic.shared_run("full"), d)
    doc = json.loads((d / "run.json").read_text())
    cell = next(c for c in doc["cells"] if c.get("records"))
    rec = load_records(d, cell["records"])
    n = 1_000_000
    rng = np.random.default_rng(3)
    events = {
        "request": rng.integers(0, len(rec["requests"]["sent_ns"]), n).astype(np.int32),
        "t_ns": np.cumsum(rng.integers(0, 80_000, n)).astype(np.int64),
        "tokens": np.ones(n, np.int32),
        "server_ns": np.full(n, -1, np.int64),
    }
    save_records(d, cell["id"], rec["requests"], events, rec["metrics"])
    del rec

    def status_mb(key: str) -> float:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith(key)) / 1024

    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pytest.skip("this kernel cannot reset the peak RSS")
    before = status_mb("VmRSS")
    export.write_exports(d)
    grew = status_mb("VmHWM") - before
    mine = pq.read_table(
        d / export.TOKENS_PARQUET, filters=[("cell", "=", cell["id"])], columns=["t_ns", "tokens"]
    )
    assert np.array_equal(mine["t_ns"].to_numpy(), events["t_ns"])
    assert int(mine["tokens"].to_numpy().sum()) == n
    # 56 MB with Arrow's pool keeping each freed row group (issue 25), 41 MB once it hands
    # them back after each row group: a row group's worth, for 1 M events as for 2 M
    assert grew < 50, f"the export grew the process by {grew:.0f} MB for {n:,} token events"


def test_an_unreadable_records_file_loses_only_its_own_rows(tmp_path):
    """A cell's .npz that cannot be read (truncated) gives one warning and no rows for that
    cell; the other cells' rows are exported (as when the export read every file whole)."""
    import pyarrow.parquet as pq

    d = tmp_path / "r"
    shutil.copytree(synthetic.shared_run("full"), d)
    doc = json.loads((d / "run.json").read_text())
    cells = [c for c in doc["cells"] if c.get("records")]
    bad = d / cells[0]["records"]
    bad.write_bytes(bad.read_bytes()[:100])
    with pytest.warns(UserWarning, match="unreadable"):
        export.write_exports(d)
    got = set(pq.read_table(d / export.TOKENS_PARQUET, columns=["cell"])["cell"].to_pylist())
    assert cells[0]["id"] not in got and cells[1]["id"] in got
