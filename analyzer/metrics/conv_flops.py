"""FLOPs of one convolution op from its ``Input Dims`` and ``Concrete Inputs``.

The formula is ``torch.utils.flop_counter.conv_flop_count``'s (forward;
bias adds not counted, as for the GEMMs):

* regular:    ``2 * N * prod(out_spatial) * C_out * prod(kernel) * C_in / groups``
* transposed: ``2 * N * prod(in_spatial) * C_in * prod(kernel) * C_out / groups``

with ``out = floor((in + 2*padding - dilation*(k - 1) - 1) / stride) + 1``
per spatial dim. The weight is ``[C_out, C_in/groups, k...]``, transposed
``[C_in, C_out/groups, k...]``. Stride, padding, dilation, groups and
``transposed`` are scalar arguments: Kineto writes them in
``args["Concrete Inputs"]`` (a list of strings, one per argument, ``''``
for tensors), not in ``Input Dims``. The argument positions are those of
each op's schema (:data:`CONV_SCHEMAS`). Shapes that do not fit the op
(channels that disagree with ``groups``, an output of size < 1, argument
lists of the wrong length) raise :class:`ShapeError`, so that the caller
falls back as for an inconsistent GEMM.

The loader keeps ``Concrete Inputs`` for :data:`analyzer.ingest.schema.CONV_OPS`
only; :func:`analyzer.metrics.matmul_flops.matmul_ops` calls this for them.
"""

from __future__ import annotations

import ast
import math
from typing import Sequence

from analyzer.metrics.shapes import ShapeError

# Per op: positions of (stride, padding, dilation, transposed, groups) in its schema; a bool: fixed by the op;
# dilation or groups None: the op has none (1).
CONV_SCHEMAS: dict[str, tuple[int, int, int | None, int | bool, int | None]] = {
    # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    "aten::convolution": (3, 4, 5, 6, 8),
    # _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, ...)
    "aten::_convolution": (3, 4, 5, 6, 8),
    # conv{1,2,3}d(input, weight, bias, stride, padding, dilation, groups)
    "aten::conv1d": (3, 4, 5, False, 6),
    "aten::conv2d": (3, 4, 5, False, 6),
    "aten::conv3d": (3, 4, 5, False, 6),
    # cudnn_convolution(input, weight, padding, stride, dilation, groups, benchmark, deterministic, allow_tf32)
    "aten::cudnn_convolution": (3, 2, 4, False, 5),
    # cudnn_convolution_transpose(input, weight, padding, output_padding, stride, dilation, groups, ...)
    "aten::cudnn_convolution_transpose": (4, 2, 5, True, 6),
    # conv_transpose{1,2,3}d(input, weight, bias, stride, padding, output_padding, groups, dilation)
    "aten::conv_transpose1d": (3, 4, 7, True, 6),
    "aten::conv_transpose2d": (3, 4, 7, True, 6),
    "aten::conv_transpose3d": (3, 4, 7, True, 6),
    # mkldnn_convolution / miopen_convolution / miopen_depthwise_convolution(input, weight, bias, padding,
    # stride, dilation, groups, ...)
    "aten::mkldnn_convolution": (4, 3, 5, False, 6),
    "aten::miopen_convolution": (4, 3, 5, False, 6),
    "aten::miopen_depthwise_convolution": (4, 3, 5, False, 6),
    # miopen_convolution_transpose(input, weight, bias, padding, output_padding, stride, dilation, groups, ...)
    "aten::miopen_convolution_transpose": (5, 3, 6, True, 7),
    # _slow_conv2d_forward(input, weight, kernel_size, bias, stride, padding)
    "aten::_slow_conv2d_forward": (4, 5, None, False, None),
}


def _value(concrete: Sequence[str], i: int | None, default: str) -> object:
    text = concrete[i] if i is not None and i < len(concrete) else ""
    text = text.strip() if isinstance(text, str) else str(text)
    if text == "":
        text = default
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # padding="same" / "valid"


def _per_dim(v: object, n: int, what: str) -> list[int]:
    vals = list(v) if isinstance(v, (list, tuple)) else [v]
    if len(vals) == 1:
        vals = vals * n
    ints = [x for x in vals if isinstance(x, int) and not isinstance(x, bool)]
    if len(vals) != n or len(ints) != n:
        raise ShapeError(f"{what} {v!r} does not fit {n} spatial dim(s)")
    return ints


# Position of output_padding (transposed convolutions only; their output's spatial size needs it).
_OUTPUT_PADDING = {
    "aten::convolution": 7,
    "aten::_convolution": 7,
    "aten::cudnn_convolution_transpose": 3,
    "aten::miopen_convolution_transpose": 4,
    "aten::conv_transpose1d": 5,
    "aten::conv_transpose2d": 5,
    "aten::conv_transpose3d": 5,
}


def conv_flops(name: str, dims: list[list[int]], concrete: Sequence[str]) -> int:
    """FLOPs of a convolution op (see the module docstring); :class:`ShapeError` when the shapes do not fit."""
    return conv_geometry(name, dims, concrete)[0]


def conv_geometry(name: str, dims: list[list[int]], concrete: Sequence[str]) -> tuple[int, int]:
    """``(FLOPs, output elements)`` of a convolution op; :class:`ShapeError` when the shapes do not fit.

    The output is ``[N, C_out, out...]``; a transposed convolution's spatial
    size is ``(in - 1) * stride - 2 * padding + dilation * (k - 1) +
    output_padding + 1`` per dim (torch.nn.ConvTranspose2d's formula).
    """
    if name not in CONV_SCHEMAS:
        raise ShapeError(f"not a convolution op: {name}")
    if len(dims) < 2 or not dims[0] or not dims[1]:
        raise ShapeError("input and weight shapes not recorded")
    x, w = [int(d) for d in dims[0]], [int(d) for d in dims[1]]
    n_sp = len(x) - 2
    if n_sp not in (1, 2, 3) or len(w) != len(x):
        raise ShapeError(f"input {x} and weight {w}: not a 1-3-D convolution")
    i_stride, i_pad, i_dil, i_tr, i_groups = CONV_SCHEMAS[name]
    transposed = i_tr if isinstance(i_tr, bool) else bool(_value(concrete, i_tr, "False"))
    groups = _value(concrete, i_groups, "1")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise ShapeError(f"groups {groups!r}")
    stride = _per_dim(_value(concrete, i_stride, "1"), n_sp, "stride")
    dilation = _per_dim(_value(concrete, i_dil, "1"), n_sp, "dilation")
    kernel = w[2:]
    pad = _value(concrete, i_pad, "0")
    if pad == "valid":
        pad = 0
    batch, c_in = x[0], x[1]
    if transposed:
        if w[0] != c_in:
            raise ShapeError(f"transposed: input channels {c_in} != weight dim 0 {w[0]}")
        c_out = w[1] * groups
        if c_in % groups:
            raise ShapeError(f"input channels {c_in} not divisible by groups {groups}")
        if pad == "same":
            raise ShapeError("padding='same' on a transposed convolution")
        p = _per_dim(pad, n_sp, "padding")
        i_op = _OUTPUT_PADDING.get(name)
        op_ = _per_dim(_value(concrete, i_op, "0"), n_sp, "output_padding") if i_op is not None else [0] * n_sp
        out = [
            (i - 1) * s - 2 * pp + d * (k - 1) + o + 1
            for i, s, pp, d, k, o in zip(x[2:], stride, p, dilation, kernel, op_)
        ]
        if any(o < 1 for o in out):
            raise ShapeError(f"transposed output spatial dims {out} from input {x} and weight {w}")
        flops = 2 * batch * math.prod(x[2:]) * c_in * math.prod(kernel) * (c_out // groups)
        return flops, batch * c_out * math.prod(out)
    c_out = w[0]
    if w[1] * groups != c_in:
        raise ShapeError(f"input channels {c_in} != weight dim 1 {w[1]} x groups {groups}")
    if c_out % groups:
        raise ShapeError(f"output channels {c_out} not divisible by groups {groups}")
    if pad == "same":
        if any(s != 1 for s in stride):
            raise ShapeError("padding='same' needs stride 1")
        out = x[2:]
    else:
        p = _per_dim(pad, n_sp, "padding")
        out = [(i + 2 * pp - d * (k - 1) - 1) // s + 1 for i, pp, d, k, s in zip(x[2:], p, dilation, kernel, stride)]
    if any(s < 1 for s in stride) or any(o < 1 for o in out):
        raise ShapeError(f"output spatial dims {out} (stride {stride}) from input {x} and weight {w}")
    return 2 * batch * math.prod(out) * c_out * math.prod(kernel) * w[1], batch * c_out * math.prod(out)
