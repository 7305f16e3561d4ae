"""Recorded operand shapes (``args["Input Dims"]``), validated as the op itself would check them.

The FLOP table (:mod:`analyzer.metrics.flop_table`) and the convolution
geometry (:mod:`analyzer.metrics.conv_flops`) read shapes through these;
a shape that does not fit raises :class:`ShapeError`, which callers turn
into "FLOPs unknown" (and a coverage gap), never a guess.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


class ShapeError(ValueError):
    """The recorded dims do not fit the op (wrong rank, inner dimensions disagree, batch not broadcastable)."""


def prod(dims: Sequence[int]) -> int:
    """Product of a shape's dims (1 for a 0-dim shape)."""
    return math.prod(int(d) for d in dims)


def shape(dims: object, ndim: int | None = None, what: str = "operand") -> list[int]:
    """A recorded shape as a list of non-negative ints, optionally of exactly ``ndim`` dims."""
    if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise ShapeError(f"{what} is not a shape: {dims!r}")
    if ndim is not None and len(dims) != ndim:
        raise ShapeError(f"{what} has {len(dims)} dims, needs {ndim}: {dims}")
    return dims


def inner(k1: int, k2: int, a: object, b: object) -> None:
    """A product's inner dimensions must agree."""
    if k1 != k2:
        raise ShapeError(f"inner dimensions disagree: {a} x {b}")


def broadcast(a: list[int], b: list[int]) -> list[int]:
    """Broadcast shape of two batch shapes (torch/numpy rules: right-aligned, equal or 1)."""
    width = max(len(a), len(b))
    a = [1] * (width - len(a)) + list(a)
    b = [1] * (width - len(b)) + list(b)
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise ShapeError(f"batch dims do not broadcast: {a} vs {b}")
        out.append(max(x, y))
    return out


def bias_fits(bias: object, out: list[int]) -> None:
    """An additive operand (bias, baddbmm's input) must broadcast to the output shape."""
    if bias is None or bias == []:
        return  # absent (None) or a scalar / undefined optional
    b = shape(bias, what="bias")
    if len(b) > len(out) or broadcast(b, out) != list(out):
        raise ShapeError(f"bias {b} does not broadcast to the output {out}")


def arg(dims: Sequence[object], i: int) -> object:
    """The ``i``-th recorded argument, None when the op recorded fewer."""
    return dims[i] if i < len(dims) else None
