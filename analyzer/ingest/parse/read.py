"""Stage 1 of reading a trace: the file's bytes, decompressed, in blocks.

Gzip is recognized by its magic bytes; every bound of
:class:`analyzer.ingest.limits.ParseLimits` on the text is checked here, as
the text is produced (a gzip bomb stops at its bound).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

# ISA-L's inflate, zlib's interface (decompressobj, unconsumed_tail, unused_data, eof, error): 3x zlib's
# speed on trace JSON (trace_diff/control's 35 MB: 11 ms against 36), the largest fixed cost of a parse.
from isal import isal_zlib as zlib

from analyzer.errors import TraceError
from analyzer.ingest.limits import FLAGS, ParseLimits
from analyzer.ingest.limits import current as current_limits

# Decompressed bytes per parse block. On df_index_resolver + control,
# 1 and 2 MB parse equally fast (per-block overhead is small: the text is
# never copied), 4 and 8 MB slower, and the peak grows with the block
# (148, 151, 164, 188 MB for 1, 2, 4, 8 MB).
BLOCK_BYTES = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
MB = 1e6


def over_bound(path: Path, what: str, limit_name: str) -> TraceError:
    """The one line for a file over a bound: what it exceeded, and the flag that raises it."""
    return TraceError(path, f"{what} (raise the bound with {FLAGS[limit_name]})")


def mib(n: int) -> str:
    """``n`` bytes in MiB, e.g. ``1,024 MiB``."""
    return f"{n / (1 << 20):,.0f} MiB"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB" if n < (10 << 30) else f"{n / (1 << 30):,.0f} GiB"


def read_blocks(path: Path, size: int | None = None, limits: ParseLimits | None = None) -> Iterator[bytes]:
    """Decompressed content of ``path`` in blocks of at most ``size`` bytes
    (default :data:`BLOCK_BYTES`).

    Gzip is recognized by its magic bytes, not the suffix; a file of several
    gzip members (``cat a.gz b.gz``) is their concatenated content, as
    ``gzip -dc`` gives. Raises TraceError for an unreadable file, a truncated
    or corrupt gzip stream, and for text over the bounds of ``limits``
    (default :func:`analyzer.ingest.limits.current`): more than
    ``max_json_bytes``, or for gzip more than
    ``limits.max_decompressed(compressed size)``, counted as it is
    decompressed so a bomb stops at the bound.
    """
    size = size or BLOCK_BYTES
    limits = limits or current_limits()
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise TraceError(path, f"cannot read file: {exc.strerror or exc}") from None
    with fh:
        head = _read(fh, path, 2)
        fh.seek(0)
        if head != _GZIP_MAGIC:
            total = 0
            while True:
                block = _read(fh, path, size)
                if not block:
                    return
                total += len(block)
                if total > limits.max_json_bytes:
                    raise over_bound(path, f"more than {_gib(limits.max_json_bytes)} of JSON", "max_json_bytes")
                yield block
        compressed = os.fstat(fh.fileno()).st_size
        yield from _gunzip(fh, path, size, compressed, limits)


def _read(fh: Any, path: Path, n: int) -> bytes:
    try:
        return fh.read(n)
    except OSError as exc:
        raise TraceError(path, f"cannot read file: {exc.strerror or exc}") from None


def _gunzip(fh: Any, path: Path, size: int, compressed: int, limits: ParseLimits) -> Iterator[bytes]:
    """The blocks of a gzip file of one or more members (see read_blocks)."""
    bound = limits.max_decompressed(compressed)
    out_bytes = 0
    # wbits=31: gzip wrapper, CRC and length checked by zlib.
    d = zlib.decompressobj(31)
    in_member = True  # d has not reached the end of its member yet
    data = b""  # compressed bytes read but not yet given to d
    at_end = False  # the file is read to its end
    while True:
        if not data and not at_end:
            data = _read(fh, path, 1 << 20)
            at_end = not data
        if not in_member:
            # Between members: zero padding (some tools pad) or the next member.
            data = data.lstrip(b"\x00")
            if not data:
                if at_end:
                    return
                continue
            if len(data) < 2 and not at_end:
                more = _read(fh, path, 1 << 20)
                at_end = not more
                data += more
                continue
            if data[:2] != _GZIP_MAGIC:
                raise TraceError(path, f"trailing garbage after gzip stream at {out_bytes / MB:.1f} MB")
            d = zlib.decompressobj(31)
            in_member = True
        try:
            block = d.decompress(data, size)
        except zlib.error as exc:  # type: ignore[misc]  # isal's stub types error as an instance; it is the class
            raise TraceError(path, f"corrupt gzip data after {out_bytes / MB:.1f} MB ({exc})") from None
        if d.eof:
            # Everything after this member. Not unused_data + unconsumed_tail:
            # on Python 3.11 both hold the bytes after the member, and
            # joining them would decompress the next member twice.
            data = d.unused_data
            in_member = False
        else:
            data = d.unconsumed_tail
        if block:
            out_bytes += len(block)
            if out_bytes > bound:
                raise _gzip_over_bound(path, bound, compressed, limits)
            yield block
        elif in_member and not data and at_end:
            # No input left and no output pending: the member never ended.
            raise TraceError(path, f"truncated gzip stream after {out_bytes / MB:.1f} MB")
        if not in_member and at_end and not data:
            return


def _gzip_over_bound(path: Path, bound: int, compressed: int, limits: ParseLimits) -> TraceError:
    if bound >= limits.max_json_bytes:
        return over_bound(path, f"decompresses to more than {_gib(bound)} of JSON", "max_json_bytes")
    return over_bound(
        path,
        f"decompresses to more than {mib(bound)}, the bound for {compressed / MB:.1f} MB of gzip "
        f"({limits.max_gzip_ratio:g}x, at least {mib(limits.gzip_floor_bytes)}; a gzip bomb?)",
        "max_gzip_ratio",
    )
