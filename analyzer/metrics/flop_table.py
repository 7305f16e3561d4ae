"""The FLOP table: ATen op name -> family, pass and formula, read by every FLOP count.

The MFU and HFU from trace shapes (:mod:`analyzer.metrics.matmul_flops`,
:mod:`analyzer.metrics.mfu`), the roofline (:mod:`analyzer.metrics.op_models`)
and docs/metrics.md ("The FLOP table") all read :data:`FLOP_TABLE`, so two
counts in one report cannot disagree. The shape is TraceLens's
``torch_op_mapping``: a registry of small per-family models.

One multiply-accumulate is 2 FLOPs; bias additions, softmax and scaling are
not counted. The formulas are ``torch.utils.flop_counter``'s:

================================= =========== ===========================================================
op                                family      FLOPs (``Input Dims``; ``Concrete Inputs`` where named)
================================= =========== ===========================================================
mm(A[m,k], B[k,n])                gemm        2 m k n
addmm(bias, A, B), _scaled_mm     gemm        2 m k n (bias not counted; fp8 operands as any other)
bmm / baddbmm (A[b,m,k], B)       gemm        2 b m k n
matmul(A[...,m,k], B[...,k,n])    gemm        2 prod(broadcast batch) m k n (1-D operands as torch.matmul)
linear(X[...,k], W[n,k], bias)    gemm        2 prod(X[:-1]) k n
_grouped_mm, _scaled_grouped_mm   gemm        MoE grouped GEMM: A[T,k] x B[g,k,n]: 2 T k n;
                                              A[g,m,k] x B[g,k,n]: 2 g m k n; A[m,K] x B[K,n] (groups
                                              along K): 2 m K n; A[g,m,k] x B[k,N]: 2 m k N
convolution and its backends      conv        2 N prod(out_spatial) C_out prod(kernel) C_in/groups
(transposed: in_spatial, C_in,                (:mod:`analyzer.metrics.conv_flops`)
C_out/groups)
convolution_backward              conv        the forward's FLOPs once per gradient output_mask asks for
(grad_out, input, weight, ...,                (input, weight); the bias gradient is not counted
output_mask)
SDPA forward, every backend       attention   2 B H L S (E + Ev): Q K^T and P V
SDPA backward, every backend      attention   2 B H L S (3 E + 2 Ev): Q K^T recomputed, dO V^T, P^T dO,
                                              dS K, Q^T dS (torch's ``sdpa_backward_flop_count``)
================================= =========== ===========================================================

**Causal attention is counted in full** (``is_causal`` does not change the
count): the convention of torch's ``FlopCounterMode`` and of PaLM's model
FLOPs (appendix B). TraceLens and FlashAttention's benchmarks count only
the unmasked part; to convert a causal row to theirs, multiply by
:func:`causal_fraction` (1/2 for a square score matrix).

**Grouped convolution's weight gradient**: torch's counter multiplies it
by ``groups`` (it takes the full input channels); the work is the
forward's, which we count. The two agree for ``groups = 1``.

**Backward** (:data:`BACKWARD_RATIO`): where a trace records no backward op
of a family, the backward of that family is estimated from its forward:
2x for GEMMs and convolutions (the input and the weight gradient are one
product of the forward's size each), 2.5x for attention with ``E = Ev``
(five products against two).

Layouts: the ``aten::_scaled_dot_product_*`` ops and the outer
``scaled_dot_product_attention`` take ``[B, H, L, E]``; the lower-level
``_flash_attention_*`` and ``_efficient_attention_*`` ops ``[B, L, H, E]``.
A variable-length call (``cum_seq_q`` recorded) has per-sequence lengths
the trace does not hold: its FLOPs are unknown (:class:`ShapeError`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from analyzer.metrics.conv_flops import CONV_SCHEMAS, conv_geometry
from analyzer.metrics.shapes import ShapeError, arg, bias_fits, broadcast, inner, prod, shape

__all__ = [
    "BACKWARD_RATIO",
    "FLOP_TABLE",
    "FlopModel",
    "ShapeError",
    "causal_fraction",
    "flops_of",
    "is_causal",
    "op_flops",
]

# Backward over forward FLOPs per family, for a family whose backward ops the trace lacks (module docstring).
BACKWARD_RATIO = {"gemm": 2.0, "conv": 2.0, "attention": 2.5}

Dims = list[Any]
Concrete = Sequence[Any] | None


@dataclass(frozen=True)
class FlopModel:
    """One op's row of the table: its ``family`` (gemm, conv, attention), whether it computes gradients
    (``backward``), its ``formula`` ``(Input Dims, Concrete Inputs) -> FLOPs`` (ShapeError when the
    shapes do not fit), and the position of ``is_causal`` among its arguments (attention only)."""

    family: str
    backward: bool
    formula: Callable[[Dims, Concrete], int]
    causal_arg: int | None = None


# -- GEMM ------------------------------------------------------------------------------------------------------


def _matmul(a: object, b: object) -> int:
    """FLOPs of torch.matmul(a, b) for the shapes it accepts (broadcast batch dims)."""
    a, b = shape(a, what="input"), shape(b, what="other")
    if len(a) == 0 or len(b) == 0:
        raise ShapeError("scalar operand")
    if len(a) == 1 and len(b) == 1:
        inner(a[0], b[0], a, b)
        return 2 * a[0]
    if len(b) == 1:  # [..., m, k] @ [k]
        inner(a[-1], b[0], a, b)
        return 2 * prod(a[:-1]) * a[-1]
    if len(a) == 1:  # [k] @ [..., k, n]
        inner(a[0], b[-2], a, b)
        return 2 * prod(b[:-2]) * b[-2] * b[-1]
    m, k, n = a[-2], a[-1], b[-1]
    inner(k, b[-2], a, b)
    return 2 * prod(broadcast(a[:-2], b[:-2])) * m * k * n


def _mm(dims: Dims, first: int = 0) -> int:
    (m, k), (k2, n) = shape(arg(dims, first), 2, "mat1"), shape(arg(dims, first + 1), 2, "mat2")
    inner(k, k2, dims[first], dims[first + 1])
    return 2 * m * k * n


def _bmm(dims: Dims, first: int = 0) -> int:
    (b, m, k), (b2, k2, n) = shape(arg(dims, first), 3, "batch1"), shape(arg(dims, first + 1), 3, "batch2")
    inner(k, k2, dims[first], dims[first + 1])
    if b != b2:
        raise ShapeError(f"batch sizes disagree: {dims[first]} x {dims[first + 1]}")
    return 2 * b * m * k * n


def _addmm(dims: Dims, _c: Concrete) -> int:
    flops = _mm(dims, 1)
    bias_fits(dims[0], [dims[1][0], dims[2][1]])
    return flops


def _baddbmm(dims: Dims, _c: Concrete) -> int:
    flops = _bmm(dims, 1)
    bias_fits(dims[0], [dims[1][0], dims[1][1], dims[2][2]])
    return flops


def _linear(dims: Dims, _c: Concrete) -> int:
    x, w = shape(arg(dims, 0), what="input"), shape(arg(dims, 1), 2, "weight")
    if len(x) == 0:
        raise ShapeError("linear input is a scalar")
    n, k = w
    inner(x[-1], k, x, w)
    bias_fits(arg(dims, 2), [*x[:-1], n])
    return 2 * prod(x[:-1]) * k * n


def _grouped_mm(dims: Dims, _c: Concrete) -> int:
    """torch's ``_grouped_mm(mat_a, mat_b, offs, ...)`` (its meta function's four cases)."""
    a, b = shape(arg(dims, 0), what="mat_a"), shape(arg(dims, 1), what="mat_b")
    if len(a) not in (2, 3) or len(b) not in (2, 3):
        raise ShapeError(f"grouped mm needs 2-D or 3-D operands: {a} x {b}")
    if len(a) == 3 and len(b) == 3:
        if a[0] != b[0]:
            raise ShapeError(f"grouped mm: group counts disagree: {a} x {b}")
        inner(a[2], b[1], a, b)
        return 2 * a[0] * a[1] * a[2] * b[2]
    if len(a) == 2 and len(b) == 3:  # tokens ragged over groups: each row meets one group's weight
        inner(a[1], b[1], a, b)
        return 2 * a[0] * a[1] * b[2]
    if len(a) == 2:  # groups along the shared dim (a weight gradient): the sum over groups of m k_g n
        inner(a[1], b[0], a, b)
        return 2 * a[0] * a[1] * b[1]
    inner(a[2], b[0], a, b)  # [g, m, k] x [k, N]: output columns ragged over groups
    return 2 * a[1] * a[2] * b[1]


# -- Attention -------------------------------------------------------------------------------------------------


def _qkv(dims: Dims, first: int, heads_first: bool) -> tuple[int, int, int, int, int]:
    """(batch x query heads, L, S, E, Ev) of an attention call's query, key and value."""
    q, k, v = (shape(arg(dims, first + i), what=w) for i, w in enumerate(("query", "key", "value")))
    if heads_first:
        if len(q) < 2 or len(k) < 2 or len(v) < 2:
            raise ShapeError("attention needs [..., L, E] operands")
        bh, seq_q, seq_k = prod(q[:-2]), q[-2], k[-2]
        seq_v = v[-2]
    else:
        if len(q) != 4 or len(k) != 4 or len(v) != 4:
            raise ShapeError(
                f"attention needs [B, L, H, E] operands (a variable-length call's lengths are not "
                f"recorded): {q}, {k}, {v}"
            )
        bh, seq_q, seq_k, seq_v = q[0] * q[2], q[1], k[1], v[1]
    inner(q[-1], k[-1], q, k)
    if seq_k != seq_v:
        raise ShapeError(f"key and value lengths disagree: {k} vs {v}")
    # Grouped-query attention: keys and values have fewer heads; the product runs over the query's heads.
    return bh, seq_q, seq_k, q[-1], v[-1]


def _sdpa(first: int = 0, heads_first: bool = True) -> Callable[[Dims, Concrete], int]:
    def forward(dims: Dims, _c: Concrete) -> int:
        bh, lq, sk, e, ev = _qkv(dims, first, heads_first)
        return 2 * bh * lq * sk * (e + ev)

    return forward


def _sdpa_backward(heads_first: bool = True) -> Callable[[Dims, Concrete], int]:
    def backward(dims: Dims, _c: Concrete) -> int:
        bh, lq, sk, e, ev = _qkv(dims, 1, heads_first)  # grad_out first
        return 2 * bh * lq * sk * (3 * e + 2 * ev)

    return backward


def _varlen_free(formula: Callable[[Dims, Concrete], int], cum_seq_arg: int) -> Callable[[Dims, Concrete], int]:
    """A formula that refuses variable-length calls (their per-sequence lengths are not in the trace)."""

    def checked(dims: Dims, c: Concrete) -> int:
        cum = arg(dims, cum_seq_arg)
        if isinstance(cum, list) and cum:
            raise ShapeError(f"variable-length attention (cum_seq {cum}): per-sequence lengths not recorded")
        return formula(dims, c)

    return checked


def causal_fraction(seq_q: int, seq_k: int) -> float:
    """Share of the ``seq_q x seq_k`` score matrix a causal mask keeps, as an area: PyTorch's ``is_causal``
    mask is top-left aligned (query i sees keys 0..i), so ``seq_q / (2 seq_k)`` when ``seq_q <= seq_k``
    and ``1 - seq_k / (2 seq_q)`` otherwise; 1/2 for a square matrix. Multiplying our (full) count of a
    causal call by it gives TraceLens's and FlashAttention's convention."""
    if seq_q <= 0 or seq_k <= 0:
        raise ShapeError(f"attention: empty sequence ({seq_q} x {seq_k})")
    return seq_q / (2 * seq_k) if seq_q <= seq_k else 1.0 - seq_k / (2 * seq_q)


# -- Convolution -----------------------------------------------------------------------------------------------


def _conv(name: str) -> Callable[[Dims, Concrete], int]:
    def forward(dims: Dims, concrete: Concrete) -> int:
        if concrete is None:
            raise ShapeError("no recorded Concrete Inputs (stride, padding, dilation, groups)")
        return conv_geometry(name, dims, concrete)[0]

    return forward


def _literal(concrete: Concrete, i: int | None) -> object:
    if concrete is None or i is None or i >= len(concrete):
        return None
    text = str(concrete[i]).strip()
    try:
        return ast.literal_eval(text) if text else None
    except (ValueError, SyntaxError):
        return None


def _conv_backward(
    grad: int, inp: int, transposed: int | bool, groups: int, mask: int
) -> Callable[[Dims, Concrete], int]:
    """convolution_backward-like ops: argument positions of grad_output, input (the weight follows the
    later of the two), ``transposed`` (or the fixed value), ``groups`` and ``output_mask``."""

    def backward(dims: Dims, concrete: Concrete) -> int:
        g, x = shape(arg(dims, grad), what="grad_output"), shape(arg(dims, inp), what="input")
        w = shape(arg(dims, max(grad, inp) + 1), what="weight")
        if len(x) < 3 or len(w) != len(x) or len(g) != len(x):
            raise ShapeError(f"grad_output {g}, input {x} and weight {w}: not a 1-3-D convolution")
        flags = _literal(concrete, mask)
        if not isinstance(flags, (list, tuple)) or len(flags) < 2 or not all(isinstance(f, bool) for f in flags):
            raise ShapeError(f"output_mask not recorded ({flags!r})")
        is_t = transposed if isinstance(transposed, bool) else _literal(concrete, transposed)
        n_groups = _literal(concrete, groups)
        if not isinstance(is_t, bool) or not isinstance(n_groups, int) or n_groups < 1:
            raise ShapeError(f"transposed {is_t!r} / groups {n_groups!r} not recorded")
        if is_t:  # weight [C_in, C_out/groups, k...]: the input's spatial points meet the kernel
            if w[0] != x[1]:
                raise ShapeError(f"transposed: input channels {x[1]} != weight dim 0 {w[0]}")
            forward = 2 * x[0] * prod(x[2:]) * w[0] * w[1] * prod(w[2:])
        else:  # weight [C_out, C_in/groups, k...]: the output's (grad_output's) spatial points
            if w[1] * n_groups != x[1] or g[1] != w[0]:
                raise ShapeError(f"input {x}, weight {w}, grad_output {g} and groups {n_groups} disagree")
            forward = 2 * g[0] * prod(g[2:]) * w[0] * w[1] * prod(w[2:])
        return forward * (int(flags[0]) + int(flags[1]))

    return backward


def _table() -> dict[str, FlopModel]:
    t: dict[str, FlopModel] = {
        "aten::mm": FlopModel("gemm", False, lambda d, c: _mm(d)),
        "aten::addmm": FlopModel("gemm", False, _addmm),
        "aten::bmm": FlopModel("gemm", False, lambda d, c: _bmm(d)),
        "aten::baddbmm": FlopModel("gemm", False, _baddbmm),
        "aten::matmul": FlopModel("gemm", False, lambda d, c: _matmul(arg(d, 0), arg(d, 1))),
        "aten::linear": FlopModel("gemm", False, _linear),
        "aten::_scaled_mm": FlopModel("gemm", False, lambda d, c: _mm(d)),
        "aten::_grouped_mm": FlopModel("gemm", False, _grouped_mm),
        "aten::_scaled_grouped_mm": FlopModel("gemm", False, _grouped_mm),
    }
    for name in CONV_SCHEMAS:
        t[name] = FlopModel("conv", False, _conv(name))
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    # output_padding, groups, output_mask); the cudnn/miopen ops of older eras take (self, grad_output, weight,
    # padding, [output_padding,] stride, dilation, groups, benchmark, deterministic, [allow_tf32,] output_mask).
    t["aten::convolution_backward"] = FlopModel("conv", True, _conv_backward(0, 1, 7, 9, 10))
    t["aten::convolution_backward_overrideable"] = t["aten::convolution_backward"]
    t["aten::cudnn_convolution_backward"] = FlopModel("conv", True, _conv_backward(1, 0, False, 6, 10))
    t["aten::cudnn_convolution_transpose_backward"] = FlopModel("conv", True, _conv_backward(1, 0, True, 7, 11))
    t["aten::miopen_convolution_backward"] = FlopModel("conv", True, _conv_backward(1, 0, False, 6, 9))
    t["aten::miopen_convolution_transpose_backward"] = FlopModel("conv", True, _conv_backward(1, 0, True, 7, 10))
    t["aten::miopen_depthwise_convolution_backward"] = t["aten::miopen_convolution_backward"]
    # Attention. Positions of is_causal from the ATen schemas: scaled_dot_product_attention(query, key, value,
    # attn_mask, dropout_p, is_causal, ...); _scaled_dot_product_flash_attention(query, key, value, dropout_p,
    # is_causal, ...) and its _for_cpu twin; _efficient / _cudnn (query, key, value, attn_bias,
    # compute_log_sumexp, dropout_p, is_causal, ...); _scaled_dot_product_attention_math(query, key, value,
    # attn_mask, dropout_p, is_causal, ...); _flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k,
    # max_q, max_k, dropout_p, is_causal, ...); _efficient_attention_forward(query, key, value, bias,
    # cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, custom_mask_type, ...).
    t["aten::scaled_dot_product_attention"] = FlopModel("attention", False, _sdpa(), 5)
    t["aten::_scaled_dot_product_attention_math"] = FlopModel("attention", False, _sdpa(), 5)
    t["aten::_scaled_dot_product_flash_attention"] = FlopModel("attention", False, _sdpa(), 4)
    t["aten::_scaled_dot_product_flash_attention_for_cpu"] = FlopModel("attention", False, _sdpa(), 4)
    t["aten::_scaled_dot_product_efficient_attention"] = FlopModel("attention", False, _sdpa(), 6)
    t["aten::_scaled_dot_product_cudnn_attention"] = FlopModel("attention", False, _sdpa(), 6)
    t["aten::_flash_attention_forward"] = FlopModel("attention", False, _varlen_free(_sdpa(0, False), 3), 8)
    t["aten::_efficient_attention_forward"] = FlopModel("attention", False, _varlen_free(_sdpa(0, False), 4))
    # Backward: (grad_out, query, key, value, out, logsumexp, ...); is_causal at 11 (flash: after cum_seq_q,
    # cum_seq_k, max_q, max_k, dropout_p), 7 (CPU flash: after dropout_p), 11 (efficient: after attn_bias, out,
    # logsumexp, philox_seed, philox_offset, dropout_p, grad_input_mask), 14 (cudnn).
    t["aten::_scaled_dot_product_flash_attention_backward"] = FlopModel("attention", True, _sdpa_backward(), 11)
    t["aten::_scaled_dot_product_flash_attention_for_cpu_backward"] = FlopModel("attention", True, _sdpa_backward(), 7)
    t["aten::_scaled_dot_product_efficient_attention_backward"] = FlopModel("attention", True, _sdpa_backward(), 11)
    t["aten::_scaled_dot_product_cudnn_attention_backward"] = FlopModel("attention", True, _sdpa_backward(), 14)
    t["aten::_flash_attention_backward"] = FlopModel("attention", True, _varlen_free(_sdpa_backward(False), 6), 11)
    t["aten::_efficient_attention_backward"] = FlopModel("attention", True, _varlen_free(_sdpa_backward(False), 6))
    return t


FLOP_TABLE: dict[str, FlopModel] = _table()


def op_flops(name: str, dims: Dims, concrete: Concrete = None) -> int:
    """FLOPs of one call of a table op from its recorded ``Input Dims`` and ``Concrete Inputs``.

    Raises :class:`ShapeError` for an op outside the table or shapes that do not fit it.
    """
    model = FLOP_TABLE.get(name)
    if model is None:
        raise ShapeError(f"not in the FLOP table: {name}")
    if not isinstance(dims, list):
        raise ShapeError(f"Input Dims is not a list: {dims!r}")
    return model.formula(dims, concrete)


def flops_of(name: str, dims: Dims) -> int:
    """FLOPs of a GEMM or attention op, which need no scalar arguments (:func:`op_flops`)."""
    return op_flops(name, dims, None)


def is_causal(op: str, concrete: Sequence[Any] | None) -> bool | None:
    """The ``is_causal`` argument of an attention op from its ``Concrete Inputs``; None: not recorded."""
    model = FLOP_TABLE.get(op)
    i = model.causal_arg if model else None
    if i is None or not concrete or i >= len(concrete):
        return None
    text = str(concrete[i]).strip()
    return True if text == "True" else False if text == "False" else None
