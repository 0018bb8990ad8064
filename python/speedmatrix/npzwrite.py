"""Writing a records file (``.npz``) in bounded memory: the file ``np.savez_compressed``
writes (``np.load`` reads it), each array copied into the zip stream 1 MiB at a time from
the array itself, and the pages of the core's columns dropped from the resident set once
written (issue 25: the end of a large cell within 1.5x of the window's peak memory)."""

from __future__ import annotations

import ctypes
import mmap
import zipfile
from typing import Any

import numpy as np
from numpy.lib import format as npformat

__all__ = ["savez_streamed"]

#: bytes of an array written to the zip stream at a time: numpy's own savez copies 16 MiB
#: chunks (two copies at once), which was most of a large cell's end-of-cell peak (issue 25)
_SAVE_CHUNK_BYTES = 1 << 20


#: madvise(2)'s MADV_PAGEOUT (Linux 5.4): reclaim these pages now. Data-safe: a clean page of
#: a file comes back from the file, a written one goes to swap or stays
_MADV_PAGEOUT = 21
_madvise: Any
try:
    _madvise = ctypes.CDLL(None, use_errno=True).madvise
    _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
except (OSError, AttributeError):  # not a libc that has it
    _madvise = None


def _external(a: np.ndarray) -> bool:
    """Whether ``a``'s memory is not numpy's: the core's columns (a capsule owns them; the
    spilled token events are its file mappings), or an ``np.memmap``."""
    base = a
    while isinstance(base, np.ndarray):
        if base.base is None:
            return False
        base = base.base
    return True


def _page_out(a: np.ndarray, start: int, stop: int) -> None:
    """Drops bytes [start, stop) of ``a``'s memory from the resident set once written: the
    spill mappings' pages were the largest part of the end of a cell left (issue 25)."""
    if _madvise is None:
        return
    lo = -(-(a.ctypes.data + start) // mmap.PAGESIZE) * mmap.PAGESIZE
    hi = (a.ctypes.data + stop) // mmap.PAGESIZE * mmap.PAGESIZE
    if hi > lo:
        _madvise(lo, hi - lo, _MADV_PAGEOUT)  # a hint: an old kernel's EINVAL changes nothing


def savez_streamed(path: str, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez_compressed``'s file (``np.load`` reads it), written 1 MiB at a time."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
        for name, a in arrays.items():
            if not a.flags.c_contiguous:  # columns are contiguous already: no copy of them
                a = a.copy(order="C")
            header = npformat.header_data_from_array_1_0(a)
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                try:
                    npformat.write_array_header_1_0(f, header)
                except ValueError:  # a header too long for format 1.0
                    npformat.write_array_header_2_0(f, header)
                flat = a.reshape(-1).view(np.uint8).data if a.size else memoryview(b"")
                external = _external(a)
                for start in range(0, len(flat), _SAVE_CHUNK_BYTES):
                    f.write(flat[start : start + _SAVE_CHUNK_BYTES])
                    if external:
                        _page_out(a, start, min(start + _SAVE_CHUNK_BYTES, len(flat)))
