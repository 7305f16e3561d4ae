"""Convolution FLOPs from Input Dims and Concrete Inputs: exact answers, and shapes that do not fit."""

from __future__ import annotations

import pytest

from analyzer.metrics.conv_flops import conv_flops
from analyzer.metrics.matmul_flops import ShapeError


def test_tracelens_timesformer_patch_embedding_row() -> None:
    """The row of TraceLens's CONV_fwd.csv on h100 timesformer: 29.595009024 GFLOPs (its GFLOPS_first).

    conv2d 128x3x224x224 by 768x3x16x16, stride 16: 14x14 outputs,
    2 * 128 * 196 * 768 * (3*16*16) FLOPs.
    """
    dims = [[128, 3, 224, 224], [768, 3, 16, 16], [768], [], [], [], [], [], []]
    concrete = ["", "", "", "[16, 16]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"]
    assert conv_flops("aten::convolution", dims, concrete) == 29_595_009_024
    assert conv_flops("aten::_convolution", dims, concrete + ["False", "False", "True", "True"]) == 29_595_009_024


def test_padding_dilation_groups_and_transposed() -> None:
    # 3x3, padding 1, stride 1: same size out; groups 2 halves the inner channels.
    assert (
        conv_flops("aten::conv2d", [[2, 8, 10, 10], [16, 4, 3, 3]], ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "2"])
        == 2 * 2 * 100 * 16 * 9 * 4
    )
    # dilation 2: effective kernel 5, out (10 - 5) + 1 = 6.
    assert (
        conv_flops("aten::conv2d", [[1, 4, 10, 10], [4, 4, 3, 3]], ["", "", "", "[1, 1]", "[0, 0]", "[2, 2]", "1"])
        == 2 * 36 * 4 * 9 * 4
    )
    # padding="same" (stride 1).
    assert (
        conv_flops("aten::conv1d", [[1, 4, 7], [6, 4, 3]], ["", "", "", "[1]", "same", "[1]", "1"]) == 2 * 7 * 6 * 3 * 4
    )
    # cudnn_convolution's own argument order (padding before stride).
    assert (
        conv_flops("aten::cudnn_convolution", [[1, 3, 9, 9], [5, 3, 3, 3]], ["", "", "[0, 0]", "[2, 2]", "[1, 1]", "1"])
        == 2 * 16 * 5 * 27
    )
    # transposed: weight [C_in, C_out/groups, k], FLOPs over the input's spatial dims.
    assert (
        conv_flops(
            "aten::conv_transpose2d",
            [[1, 4, 5, 5], [4, 3, 2, 2]],
            ["", "", "", "[2, 2]", "[0, 0]", "[0, 0]", "1", "[1, 1]"],
        )
        == 2 * 25 * 4 * 4 * 3
    )
    assert (
        conv_flops(
            "aten::convolution",
            [[1, 4, 5, 5], [4, 3, 2, 2]],
            ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "True", "[0, 0]", "1"],
        )
        == 2 * 25 * 4 * 4 * 3
    )


@pytest.mark.parametrize(
    "name,dims,concrete",
    [
        (
            "aten::conv2d",
            [[1, 3, 8, 8], [4, 2, 3, 3]],
            ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "1"],
        ),  # channels disagree
        (
            "aten::conv2d",
            [[1, 4, 8, 8], [4, 2, 3, 3]],
            ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "3"],
        ),  # groups do not fit
        ("aten::conv2d", [[1, 3, 2, 2], [4, 3, 3, 3]], ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "1"]),  # output < 1
        ("aten::conv2d", [[1, 3, 8, 8], [4, 3, 3]], ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "1"]),  # weight rank
        (
            "aten::conv2d",
            [[1, 3, 8, 8], [4, 3, 3, 3]],
            ["", "", "", "[1, 1, 1]", "[0, 0]", "[1, 1]", "1"],
        ),  # stride length
        ("aten::conv2d", [[1, 3, 8, 8], [4, 3, 3, 3]], ["", "", "", "[2, 2]", "same", "[1, 1]", "1"]),  # same + stride
        ("aten::mm", [[2, 3], [3, 4]], []),
    ],
)
def test_shapes_that_do_not_fit_raise(name, dims, concrete) -> None:
    with pytest.raises(ShapeError):
        conv_flops(name, dims, concrete)


def _conv_stack(t, s0: float, dims, concrete, *, kernel_us: float = 40.0) -> None:
    """conv2d > convolution > _convolution > cudnn_convolution, as eager PyTorch records them, launching one cuDNN kernel."""
    x, w = dims
    t.cpu_op(
        "aten::conv2d",
        s0,
        100,
        input_dims=[x, w, [], [], [], [], []],
        args={"Concrete Inputs": concrete[:3] + concrete[3:6] + [concrete[8]]},
    )
    t.cpu_op(
        "aten::convolution",
        s0 + 5,
        90,
        input_dims=[x, w, [], [], [], [], [], [], []],
        args={"Concrete Inputs": concrete},
    )
    t.cpu_op(
        "aten::_convolution",
        s0 + 10,
        80,
        input_dims=[x, w, [], [], [], [], [], [], [], [], [], [], []],
        args={"Concrete Inputs": concrete + ["False", "False", "True", "True"]},
    )
    t.cpu_op(
        "aten::cudnn_convolution",
        s0 + 15,
        70,
        input_dims=[x, w, [], [], [], [], [], [], []],
        args={
            "Concrete Inputs": ["", "", concrete[4], concrete[3], concrete[5], concrete[8], "False", "False", "True"]
        },
    )
    t.kernel("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", s0 + 30, kernel_us, launch_us=s0 + 20)


def test_parsed_conv_stack_counts_its_flops_once_and_covers_its_kernel(tmp_path) -> None:
    """From a written trace: the loader keeps Concrete Inputs for conv ops only; the four nested ops count once."""
    from synth import KinetoTrace

    from analyzer.ingest.load import load_trace
    from analyzer.metrics.matmul_flops import flop_kernels, matmul_ops
    from analyzer.metrics.mfu import charged_ops

    t = KinetoTrace(rank=0, world_size=1, distributed=False)
    t.step(1, 0, 1000)
    concrete = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    _conv_stack(t, 10, ([8, 16, 32, 32], [32, 16, 3, 3]), concrete)
    t.cpu_op("aten::relu", 200, 10, input_dims=[[8, 32, 16, 16]], args={"Concrete Inputs": [""]})
    ev = load_trace(t.write(tmp_path / "rank0.json.gz")).events
    kept = ev.loc[ev["concrete_inputs"].notna(), "name"].astype(str).tolist()
    assert sorted(kept) == sorted(
        ["aten::conv2d", "aten::convolution", "aten::_convolution", "aten::cudnn_convolution"]
    )
    ops = matmul_ops(ev)
    expected = 2 * 8 * (16 * 16) * 32 * (16 * 3 * 3)  # out 16x16: (32 + 2 - 2 - 1) // 2 + 1
    assert ops["flops"].tolist() == [float(expected)] * 4
    assert float(ops.loc[ops["counted"], "flops"].sum()) == expected  # counted once, at the outermost op
    k = flop_kernels(ev, ops)
    assert len(k) == 1 and int(k["account"].iloc[0]) >= 0  # the cuDNN kernel's FLOPs are known: coverage 100 %
    assert int(charged_ops(ops, k).sum()) == 1


def test_conv_with_inconsistent_shapes_is_listed_not_counted(tmp_path) -> None:
    from synth import KinetoTrace

    from analyzer.ingest.load import load_trace
    from analyzer.metrics.matmul_flops import matmul_ops

    t = KinetoTrace(rank=0, world_size=1, distributed=False)
    t.step(1, 0, 1000)
    # 16 input channels against a weight of 8 per group, groups 1: the shapes do not fit the op.
    _conv_stack(
        t, 10, ([8, 16, 32, 32], [32, 8, 3, 3]), ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    )
    ops = matmul_ops(load_trace(t.write(tmp_path / "rank0.json.gz")).events)
    assert ops["flops"].isna().all() and not ops["counted"].any()
    assert all("input channels 16" in e for e in ops["shape_error"])


def test_conv_schemas_cover_exactly_the_loader_conv_ops() -> None:
    from analyzer.metrics.conv_flops import CONV_SCHEMAS
    from analyzer.ingest.schema import CONV_OPS

    assert set(CONV_SCHEMAS) == set(CONV_OPS)
