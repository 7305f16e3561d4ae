"""FLOPs and bytes moved by one call of an op, from its recorded shapes, types and scalar arguments.

The roofline's per-op models (:mod:`analyzer.metrics.roofline` turns them
into rates against the device's peaks; docs/metrics.md, "Roofline"). Each
model reads one forward call's ``Input Dims``, ``Input type`` and
``Concrete Inputs`` (as the loader keeps them: lists, one entry per
argument) and returns a :class:`CallCost`; shapes that do not fit the op
raise :class:`ShapeError`. Bytes count every tensor the kernel must read or
write once, at its dtype's size (no cache reuse, no re-reads): the
minimum traffic, so achieved bytes/s is a lower bound on the real one.

Families (``CallCost.family``):

* ``gemm`` (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``, ``linear``,
  ``_scaled_mm``), ``attention`` (ATTENTION_OPS) and ``conv`` (CONV_OPS):
  FLOPs from the FLOP table (:mod:`analyzer.metrics.flop_table`, which the
  MFU reads too: causal attention counted in full, as torch's counter
  does; TraceLens halves a square causal call, :func:`causal_fraction`
  converts); bytes every tensor input plus the output for a GEMM
  (TraceLens's GEMM model), query, key, value and output for attention
  (TraceLens's SDPA model: no mask tensor), input, weight, bias and output
  for a convolution (TraceLens's CONV model leaves the bias out).
* ``elementwise``: unary ops (UNARY_OPS, and ``pow`` with a scalar
  exponent) one FLOP per output element, bytes input plus output (a
  ``copy_``'s source and destination at their own dtypes); binary ops
  (BINARY_OPS) one FLOP per element of the broadcast output, bytes both
  inputs at their own sizes plus the output at the promoted dtype (the
  wider input's). A ``Scalar`` argument is passed by value and moves no
  bytes; a 0-dim tensor is one element. These are TraceLens's unary and
  binary elementwise models.
* ``reduction`` (REDUCTION_OPS): one FLOP per input element; bytes the
  input plus the reduced output (the dims from the op's ``dim`` argument,
  all of them when absent; ``argmax``/``argmin`` write int64). TraceLens
  counts one output element whatever ``dim`` says.
* ``softmax`` (SOFTMAX_OPS): five FLOPs per element (the safe softmax's
  max, subtract, exp, sum and divide); bytes input plus output, the output
  fp32 when ``half_to_float``.
* ``normalization`` (NORM_OPS): per element, 6 FLOPs for mean and
  variance statistics and the normalization (layer, group and training
  batch norm: add for the mean; subtract, square, add for the variance;
  subtract and multiply by the reciprocal deviation), 3 for RMS norm (square,
  add, multiply) and 2 for inference batch norm, plus one per affine weight
  and one per bias; bytes input plus output plus weight and bias (and batch
  norm's running statistics, read and written). The per-row statistics a
  training layer norm saves are not counted (2 fp32 values per row: under
  2 % of the traffic from 128 channels up). TraceLens's model differs (5
  FLOPs per element plus 6 per channel, bytes input plus output plus 6
  channels' worth, for every norm); the input and output traffic is the
  same (docs/metrics.md, "Roofline").

Backward: the FLOP table's ratios (:data:`BACKWARD_FLOPS`: a GEMM's and a
convolution's gradients are two products of the forward's size, 2x FLOPs;
attention's five against two, 2.5x); bytes 2x. The memory-bound families'
backward ops vary too much per op to scale (no entry for them), so the
roofline leaves their backward rows out and says so.
"""

from __future__ import annotations

import ast
import math
from typing import Any, NamedTuple

from analyzer.ingest.schema import (
    ATTENTION_INNER_OPS,
    ATTENTION_OPS,
    BINARY_OPS,
    CONV_OPS,
    NORM_OPS,
    REDUCTION_OPS,
    SOFTMAX_OPS,
    UNARY_OPS,
)
from analyzer.metrics.conv_flops import conv_geometry
from analyzer.metrics.dtypes import INPUT_TYPES, float_key
from analyzer.metrics.flop_table import BACKWARD_RATIO, ShapeError, causal_fraction, flops_of, is_causal, op_flops

__all__ = [
    "BACKWARD_BYTES",
    "BACKWARD_FLOPS",
    "MEMORY_FAMILIES",
    "CallCost",
    "causal_fraction",
    "is_causal",
    "numel",
    "per_call",
]

# Backward over forward FLOPs per family (the FLOP table's); bytes: BACKWARD_BYTES. Families without an entry
# have no backward model.
BACKWARD_FLOPS = BACKWARD_RATIO
BACKWARD_BYTES = 2.0
# Families whose rows are memory-bound whatever their dtype: a few FLOPs per byte at most, far under any
# device's ridge (the roofline times them against the HBM).
MEMORY_FAMILIES = frozenset({"elementwise", "reduction", "softmax", "normalization"})
# Where the first matrix operand sits (its last dimension is the product's inner dimension).
_FIRST_MATRIX = {
    "aten::mm": 0,
    "aten::addmm": 1,
    "aten::bmm": 0,
    "aten::baddbmm": 1,
    "aten::matmul": 0,
    "aten::linear": 0,
    "aten::_scaled_mm": 0,
}
# Position of a reduction's ``dim`` argument: sum.dim_IntList(self, dim, keepdim, dtype), mean, amax, amin,
# argmax, max.dim, logsumexp, var.correction(self, dim, ...), std; linalg_vector_norm(self, ord, dim, ...) and
# norm.ScalarOpt_dim(self, p, dim, ...).
_REDUCE_DIM_ARG = {"aten::linalg_vector_norm": 2, "aten::norm": 2}
_INDEX_OUTPUT = {"aten::argmax", "aten::argmin"}
# Normalization ops: (position of weight, of bias, FLOPs per element for statistics and normalization,
# position of batch norm's `training` flag or None). native_layer_norm(input, normalized_shape, weight, bias,
# eps); layer_norm(..., cudnn_enable); rms_norm / _fused_rms_norm(input, normalized_shape, weight, eps);
# native_batch_norm / batch_norm / _batch_norm_impl_index / cudnn_batch_norm / miopen_batch_norm(input, weight, bias, running_mean,
# running_var, training, ...); native_group_norm(input, weight, bias, N, C, HxW, group, eps);
# group_norm(input, num_groups, weight, bias, eps, cudnn_enabled).
_NORMS: dict[str, tuple[int, int | None, int, int | None]] = {
    "aten::native_layer_norm": (2, 3, 6, None),
    "aten::layer_norm": (2, 3, 6, None),
    "aten::rms_norm": (2, None, 3, None),
    "aten::_fused_rms_norm": (2, None, 3, None),
    "aten::native_batch_norm": (1, 2, 6, 5),
    "aten::batch_norm": (1, 2, 6, 5),
    "aten::_batch_norm_impl_index": (1, 2, 6, 5),
    "aten::cudnn_batch_norm": (1, 2, 6, 5),
    "aten::miopen_batch_norm": (1, 2, 6, 5),
    "aten::native_group_norm": (1, 2, 6, None),
    "aten::group_norm": (2, 3, 6, None),
}
_BATCH_NORM_STATS = (3, 4)  # running_mean, running_var


class CallCost(NamedTuple):
    """One forward call: ``flops``, ``bytes`` moved, ``dtype`` (the peak table's key: bf16, fp16, fp8, fp32, or
    None), ``causal`` (attention's mask; None elsewhere or unrecorded) and the model's ``family``."""

    flops: float
    bytes: float
    dtype: str | None
    causal: bool | None
    family: str


def numel(dims: object) -> int:
    """Elements of a shape (``[]``: a 0-dim tensor, 1 element; not a shape: 0)."""
    if not isinstance(dims, list) or not all(isinstance(d, int) for d in dims):
        return 0
    return math.prod(dims)


def _flag(concrete: list[Any] | None, i: int | None) -> bool | None:
    if i is None or not concrete or i >= len(concrete):
        return None
    text = str(concrete[i]).strip()
    return True if text == "True" else False if text == "False" else None


def _size(types: list[Any], i: int) -> tuple[int, str | None]:
    t = types[i] if i < len(types) else None
    return INPUT_TYPES.get(t, (0, None)) if isinstance(t, str) else (0, None)


def _first_size(op: str, types: list[Any], i: int = 0) -> tuple[int, str | None]:
    elem, dtype = _size(types, i)
    if elem == 0:
        raise ShapeError(f"{op}: unknown element type {types[i] if i < len(types) else None!r}")
    return elem, dtype


def _is_shape(d: object) -> bool:
    return isinstance(d, list) and all(isinstance(x, int) for x in d)


def _gemm(op: str, dims: list[Any], types: list[Any]) -> CallCost:
    flops = float(flops_of(op, dims))  # raises ShapeError for shapes it cannot count
    tensors = [i for i, d in enumerate(dims) if isinstance(d, list) and d]
    if not tensors:
        raise ShapeError(f"{op}: no tensor inputs")
    first = _FIRST_MATRIX[op]
    k = int(dims[first][-1])
    out_numel = int(flops // (2 * k)) if k else 0
    elem, dtype = _first_size(op, types, first)
    in_bytes = sum(numel(dims[i]) * (_size(types, i)[0] or elem) for i in tensors)
    # mm(a, b, out=c) / bmm(..., out=c) record the output as a third input: it is written once, not twice.
    out_given = op in ("aten::mm", "aten::bmm") and len(dims) > 2 and numel(dims[2]) == out_numel
    return CallCost(flops, float(in_bytes + (0 if out_given else out_numel * elem)), dtype, None, "gemm")


def _attention(op: str, dims: list[Any], types: list[Any], concrete: list[Any] | None) -> CallCost:
    if len(dims) < 3 or not all(_is_shape(d) and d for d in dims[:3]):
        raise ShapeError(f"{op}: query, key and value shapes not recorded")
    q, k, v = dims[0], dims[1], dims[2]
    causal = is_causal(op, concrete)
    flops = float(op_flops(op, dims, concrete))  # ShapeError for shapes that do not fit
    elem, dtype = _first_size(op, types)
    # Query, key, value read and the output (the query's shape with the value's last dimension) written once.
    n = numel(q) + numel(k) + numel(v) + numel(q[:-1]) * int(v[-1])
    return CallCost(flops, float(n * elem), dtype, causal, "attention")


def _conv(op: str, dims: list[Any], types: list[Any], concrete: list[Any] | None) -> CallCost:
    if concrete is None:
        raise ShapeError(f"{op}: no recorded Concrete Inputs (stride, padding, dilation, groups)")
    flops, out_numel = op_flops(op, dims, concrete), conv_geometry(op, dims, concrete)[1]
    elem, dtype = _first_size(op, types)
    bias = (
        dims[2]
        if len(dims) > 2
        and _is_shape(dims[2])
        and dims[2]
        and op not in ("aten::cudnn_convolution", "aten::cudnn_convolution_transpose")
        else []
    )
    n = numel(dims[0]) + numel(dims[1]) + (numel(bias) if bias else 0) + out_numel
    return CallCost(float(flops), float(n * elem), dtype, None, "conv")


def _operands(op: str, dims: list[Any], types: list[Any], count: int) -> list[tuple[list[int], int]]:
    """The first ``count`` arguments as (shape, element size); a Scalar is ([], 0): passed by value."""
    out: list[tuple[list[int], int]] = []
    for i in range(count):
        if i >= len(dims) or not _is_shape(dims[i]):
            raise ShapeError(f"{op}: argument {i} is not a tensor or scalar")
        t = types[i] if i < len(types) else None
        if t == "Scalar":
            out.append(([], 0))
            continue
        elem = _size(types, i)[0]
        if elem == 0:
            raise ShapeError(f"{op}: unknown element type {t!r}")
        out.append((list(dims[i]), elem))
    return out


def _broadcast(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise ShapeError(f"shapes {a} and {b} do not broadcast")
        out.append(max(x, y) if 0 not in (x, y) else 0)
    return out


def _elementwise(op: str, dims: list[Any], types: list[Any]) -> CallCost:
    binary = op in BINARY_OPS or (
        op == "aten::pow"
        and len(dims) > 1
        and _is_shape(dims[1])
        and bool(dims[1])
        and (types[1] if len(types) > 1 else None) != "Scalar"
    )
    if binary:
        (a, ea), (b, eb) = _operands(op, dims, types, 2)
        out = _broadcast(a, b)
        n_out = numel(out)
        e_out = max(ea if a else 0, eb if b else 0) or max(ea, eb)  # dimensioned tensors decide the promotion
        nbytes = (numel(a) * ea if ea else 0) + (numel(b) * eb if eb else 0) + n_out * e_out
        return CallCost(float(n_out), float(nbytes), float_key(types), None, "elementwise")
    if op == "aten::copy_":  # copy_(self: destination, src): each at its own dtype
        (dst, e_dst), (src, e_src) = _operands(op, dims, types, 2)
        n = numel(dst)
        return CallCost(
            float(n),
            float(n * e_dst + numel(src) * e_src),
            float_key(types[1:2]) or float_key(types),
            None,
            "elementwise",
        )
    ((x, e),) = _operands(op, dims, types, 1)
    if not e:
        raise ShapeError(f"{op}: no tensor input")
    n = numel(x)
    return CallCost(float(n), float(2 * n * e), float_key(types), None, "elementwise")


def _reduced_dims(op: str, shape: list[int], concrete: list[Any] | None) -> list[int]:
    """The dims a reduction reduces (normalized, non-negative): from its ``dim`` argument, all when absent."""
    i = _REDUCE_DIM_ARG.get(op, 1)
    text = str(concrete[i]).strip() if concrete and i < len(concrete) else ""
    if text in ("", "None", "[]"):
        return list(range(len(shape)))
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError) as e:
        raise ShapeError(f"{op}: dim {text!r} unreadable") from e
    if isinstance(value, bool) or not isinstance(value, (int, list, tuple)):
        raise ShapeError(f"{op}: dim {text!r}")
    wanted = [value] if isinstance(value, int) else list(value)
    nd = max(1, len(shape))
    if not all(isinstance(d, int) and -nd <= d < nd for d in wanted):
        raise ShapeError(f"{op}: dim {text!r} outside a {len(shape)}-dim input")
    return sorted({d % nd for d in wanted})


def _reduction(op: str, dims: list[Any], types: list[Any], concrete: list[Any] | None) -> CallCost:
    ((x, e),) = _operands(op, dims, types, 1)
    if not e:
        raise ShapeError(f"{op}: no tensor input")
    reduced = set(_reduced_dims(op, x, concrete))
    n_in = numel(x)
    n_out = math.prod(d for i, d in enumerate(x) if i not in reduced)
    e_out = 8 if op in _INDEX_OUTPUT else e
    return CallCost(float(n_in), float(n_in * e + n_out * e_out), float_key(types), None, "reduction")


def _softmax(op: str, dims: list[Any], types: list[Any], concrete: list[Any] | None) -> CallCost:
    ((x, e),) = _operands(op, dims, types, 1)
    if not e:
        raise ShapeError(f"{op}: no tensor input")
    n = numel(x)
    half_to_float = op in ("aten::_softmax", "aten::_log_softmax") and _flag(concrete, 2) is True
    return CallCost(float(5 * n), float(n * (e + (4 if half_to_float else e))), float_key(types), None, "softmax")


def _normalization(op: str, dims: list[Any], types: list[Any], concrete: list[Any] | None) -> CallCost:
    i_w, i_b, per_elem, i_train = _NORMS[op]
    ((x, e),) = _operands(op, dims, types, 1)
    if not e or not x:
        raise ShapeError(f"{op}: no input tensor")
    n = numel(x)

    def tensor(i: int | None) -> int:
        if i is None or i >= len(dims) or not _is_shape(dims[i]) or not dims[i]:
            return 0
        return numel(dims[i]) * (_size(types, i)[0] or e)

    w_bytes, b_bytes = tensor(i_w), tensor(i_b)
    stats = 0
    if i_train is not None:
        if _flag(concrete, i_train) is False:
            per_elem = 2  # inference: normalize with the running statistics, no statistics pass
        stats = 2 * sum(tensor(i) for i in _BATCH_NORM_STATS)  # running mean and variance, read and written
    flops = n * (per_elem + (1 if w_bytes else 0) + (1 if b_bytes else 0))
    return CallCost(float(flops), float(2 * n * e + w_bytes + b_bytes + stats), float_key(types), None, "normalization")


def per_call(op: str, dims: list[Any], types: list[Any], concrete: list[Any] | None = None) -> CallCost:
    """The cost of one forward call of ``op`` (module docstring); ShapeError for an op without a model or
    shapes that do not fit it. ``dims``/``types``/``concrete``: the op's Input Dims, Input type and Concrete
    Inputs as lists (``concrete`` None: not recorded)."""
    if op in _FIRST_MATRIX:
        return _gemm(op, dims, types)
    if op in ATTENTION_OPS or op in ATTENTION_INNER_OPS:
        return _attention(op, dims, types, concrete)
    if op in CONV_OPS:
        return _conv(op, dims, types, concrete)
    if op in UNARY_OPS or op in BINARY_OPS:
        return _elementwise(op, dims, types)
    if op in REDUCTION_OPS:
        return _reduction(op, dims, types, concrete)
    if op in SOFTMAX_OPS:
        return _softmax(op, dims, types, concrete)
    if op in NORM_OPS:
        return _normalization(op, dims, types, concrete)
    raise ShapeError(f"{op}: no roofline model")
