"""Data safety of saved runs (issue 14): file modes follow the umask, a failed write (a full
disk) keeps the previous file and says so in one line, run.json cannot point its records
outside its folder, and a damaged run.json is a one-line SpeedmatrixError."""

from __future__ import annotations

import errno
import json
import os
import stat
import zipfile

import numpy as np
import pytest
from speedmatrix import runfile
from speedmatrix.errors import SpeedmatrixError

DOC = {"schema": runfile.SCHEMA, "meta": {}, "cells": []}


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_files_get_0666_less_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        path = runfile.write_run(tmp_path, DOC)
        rel = runfile.save_records(tmp_path, "decode-8k-c1", {"x": np.arange(3)}, {})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / rel).stat().st_mode) == mode


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_keeps_the_previous_run_json_and_says_so(tmp_path, monkeypatch):
    runfile.write_run(tmp_path, {**DOC, "meta": {"n": 1}})
    before = (tmp_path / "run.json").read_bytes()
    monkeypatch.setattr(os, "fsync", _disk_full)
    with pytest.raises(runfile.RunFileError, match="disk is full") as info:
        runfile.write_run(tmp_path, {**DOC, "meta": {"n": 2}})
    assert isinstance(info.value, SpeedmatrixError) and "\n" not in str(info.value)
    assert (tmp_path / "run.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no temp file left


def test_a_full_disk_while_saving_records_leaves_no_half_file(tmp_path, monkeypatch):
    # the disk fills while an array is written into the records file, the file half made
    monkeypatch.setattr(zipfile._ZipWriteFile, "write", _disk_full)
    with pytest.raises(runfile.RunFileError, match="disk is full"):
        runfile.save_records(tmp_path, "decode-8k-c1", {"x": np.arange(3)}, {})
    assert list((tmp_path / "records").iterdir()) == []


@pytest.mark.parametrize(
    "rel", ["../outside.npz", "records/../../outside.npz", "/etc/passwd", "records/link.npz"]
)
def test_records_outside_the_run_folder_are_refused(tmp_path, rel):
    run = tmp_path / "run"
    runfile.save_records(run, "c", {"x": np.arange(3)}, {})
    outside = tmp_path / "outside.npz"
    (run / "records" / "c.npz").rename(outside)
    (run / "records" / "link.npz").symlink_to(outside)
    with pytest.raises(runfile.RunFileError, match="outside records/"):
        runfile.load_records(run, rel)


def test_records_inside_are_read(tmp_path):
    rel = runfile.save_records(tmp_path, "c", {"x": np.arange(3)}, {})
    assert runfile.load_records(tmp_path, rel)["requests"]["x"].tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"", "empty"),
        (b'{"schema": "speedmatrix.run/1", "meta": {}, "cel', "not valid JSON"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "not UTF-8"),
        (json.dumps({"schema": "other/9", "cells": []}).encode(), "unsupported schema"),
        (b"[1, 2]", "expected a JSON object"),
    ],
    ids=["empty", "truncated", "binary", "wrong-schema", "not-object"],
)
def test_a_damaged_run_json_is_one_line(tmp_path, content, needle):
    (tmp_path / "run.json").write_bytes(content)
    with pytest.raises(SpeedmatrixError, match=needle) as info:
        runfile.read_run(tmp_path)
    assert "\n" not in str(info.value)
