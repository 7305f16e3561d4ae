"""The FLOP table: its op names are the loader's, and its formulas agree with torch's FlopCounterMode.

FlopCounterMode runs the real ATen op on small CPU tensors here: an independent count of the same call,
whose arguments are written out as the profiler records them (Input Dims, Concrete Inputs).
"""

from __future__ import annotations

import pytest

from analyzer.ingest.schema import CONCRETE_OPS, CONV_BACKWARD_OPS, CONV_OPS, FLOP_OPS, SHAPE_OPS
from analyzer.metrics.flop_table import FLOP_TABLE, ShapeError, op_flops

torch = pytest.importorskip("torch")
aten = torch.ops.aten


def test_the_table_and_the_loader_name_the_same_ops() -> None:
    assert set(FLOP_TABLE) == set(FLOP_OPS)
    assert set(FLOP_TABLE) <= set(SHAPE_OPS)
    # Every op whose formula reads scalar arguments (convolution geometry, output_mask) or is_causal has them kept.
    needs = {n for n, m in FLOP_TABLE.items() if m.family in ("conv", "attention")}
    assert needs <= set(CONCRETE_OPS)
    assert {n for n, m in FLOP_TABLE.items() if m.backward} >= set(CONV_BACKWARD_OPS)


def _counted(fn, *args) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return int(counter.get_total_flops())


def _text(v: object) -> str:
    return str(list(v)) if isinstance(v, tuple) else str(v)


@pytest.mark.parametrize(
    ("stride", "padding", "dilation", "transposed", "mask"),
    [
        ((1, 1), (1, 1), (1, 1), False, (True, True, False)),
        ((2, 2), (0, 0), (1, 1), False, (False, True, True)),  # a first layer: no input gradient
        ((1, 1), (2, 2), (2, 2), False, (True, False, False)),
        ((2, 2), (1, 1), (1, 1), True, (True, True, False)),
    ],
)
def test_convolution_backward_matches_flop_counter(stride, padding, dilation, transposed, mask) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 9)
    w = torch.randn(4, 6, 3, 3) if transposed else torch.randn(6, 4, 3, 3)
    out_pad = (1, 1) if transposed else (0, 0)
    y = aten.convolution(x, w, None, stride, padding, dilation, transposed, out_pad, 1)
    g = torch.randn_like(y)
    args = (g, x, w, None, stride, padding, dilation, transposed, out_pad, 1, mask)
    truth = _counted(aten.convolution_backward, *args)
    dims = [list(g.shape), list(x.shape), list(w.shape), [], [], [], [], [], [], [], []]
    concrete = ["", "", "", "None"] + [_text(a) for a in args[4:]]
    assert op_flops("aten::convolution_backward", dims, concrete) == truth > 0
    # The forward of the same call, from its own row of the table.
    fwd_dims = [list(x.shape), list(w.shape), [], [], [], [], [], [], []]
    fwd_concrete = [
        "",
        "",
        "None",
        _text(stride),
        _text(padding),
        _text(dilation),
        str(transposed),
        _text(out_pad),
        "1",
    ]
    assert op_flops("aten::convolution", fwd_dims, fwd_concrete) == _counted(
        aten.convolution, x, w, None, stride, padding, dilation, transposed, out_pad, 1
    )


def test_convolution_backward_without_output_mask_is_unknown() -> None:
    with pytest.raises(ShapeError, match="output_mask"):
        op_flops("aten::convolution_backward", [[2, 6, 9, 9], [2, 4, 9, 9], [6, 4, 3, 3]], None)


def test_grouped_convolution_weight_gradient_counts_the_forward_work() -> None:
    # torch's counter takes the full input channels for the weight gradient (groups x the forward's products);
    # the work is the forward's: one product per (output point, kernel tap, input channel of the group).
    x, w, g = [2, 8, 9, 9], [8, 2, 3, 3], [2, 8, 9, 9]  # groups 4: 2 input channels per group
    fwd = 2 * 2 * 81 * 8 * 9 * 2
    concrete = ["", "", "", "None", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "4", "[True, True, False]"]
    assert op_flops("aten::convolution_backward", [g, x, w], concrete) == 2 * fwd


@pytest.mark.parametrize("gqa", [False, True])
def test_attention_forward_and_backward_match_flop_counter(gqa: bool) -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, 16, 8)
    k = torch.randn(2, 2 if gqa else 4, 24, 8)
    v = torch.randn(2, 2 if gqa else 4, 24, 6)
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    fwd, bwd = (
        sdpa_flop_count(q.shape, k.shape, v.shape),
        sdpa_backward_flop_count((2, 4, 16, 6), q.shape, k.shape, v.shape),
    )
    qkv = [list(q.shape), list(k.shape), list(v.shape)]
    for op in (
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_attention_math",
    ):
        assert op_flops(op, qkv + [[]] * 4) == fwd, op
    for op in (
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        "aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_cudnn_attention_backward",
    ):
        assert op_flops(op, [[2, 4, 16, 6]] + qkv + [[2, 4, 16, 6], [2, 4, 16]]) == bwd, op
    # The kernels' own entry points take [B, L, H, E].
    bshe = [[s[0], s[2], s[1], s[3]] for s in qkv]
    assert op_flops("aten::_flash_attention_forward", bshe + [[]] * 6) == fwd
    assert op_flops("aten::_efficient_attention_backward", [[2, 16, 4, 6]] + bshe + [[]] * 8) == bwd


def test_variable_length_attention_is_unknown_not_guessed() -> None:
    packed = [[100, 4, 8], [100, 4, 8], [100, 4, 8]]
    with pytest.raises(ShapeError):
        op_flops("aten::_flash_attention_forward", packed + [[5], [5], [], []])


@pytest.mark.parametrize(
    ("a", "b", "flops"),
    [
        ([96, 16], [4, 16, 32], 2 * 96 * 16 * 32),  # tokens ragged over 4 experts
        ([4, 24, 16], [4, 16, 32], 2 * 4 * 24 * 16 * 32),  # batched experts
        ([32, 96], [96, 16], 2 * 32 * 96 * 16),  # weight gradient: groups along the token dim
        ([4, 24, 16], [16, 96], 2 * 24 * 16 * 96),  # output columns ragged over groups
    ],
)
def test_grouped_mm(a, b, flops) -> None:
    assert op_flops("aten::_grouped_mm", [a, b, [4]]) == flops
    assert op_flops("aten::_scaled_grouped_mm", [a, b, [4], [4]]) == flops


def test_scaled_mm_matches_flop_counter() -> None:
    from torch.utils.flop_counter import flop_registry

    assert op_flops("aten::_scaled_mm", [[64, 32], [32, 48], [], []]) == flop_registry[aten._scaled_mm](
        (64, 32), (32, 48), (), ()
    )


def test_every_convolution_backend_counts_like_the_entry_op() -> None:
    # A 3x3 stride-2 convolution recorded at each backend's own argument positions.
    x, w = [2, 4, 9, 9], [6, 4, 3, 3]
    truth = 2 * 2 * 5 * 5 * 6 * 9 * 4
    rows = {
        "aten::convolution": ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"],
        "aten::mkldnn_convolution": ["", "", "", "[1, 1]", "[2, 2]", "[1, 1]", "1"],
        "aten::miopen_convolution": ["", "", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "False", "False"],
        "aten::_slow_conv2d_forward": ["", "", "[3, 3]", "", "[2, 2]", "[1, 1]"],
    }
    for op, concrete in rows.items():
        assert op in CONV_OPS
        assert op_flops(op, [x, w], concrete) == truth, op
