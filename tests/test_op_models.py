"""The roofline's per-call models (analyzer.metrics.op_models) on hand-computed shapes: each family's FLOPs and bytes
exactly, the dtype key, and the ShapeError for shapes that do not fit."""

from __future__ import annotations

import pytest

from analyzer.metrics.matmul_flops import ShapeError
from analyzer.metrics.op_models import per_call

BF16, F32, I64 = "c10::BFloat16", "float", "long int"


def test_unary_ops_read_and_write_each_element_once():
    c = per_call("aten::gelu", [[8, 1024], []], [BF16, ""], ["", "'none'"])
    assert (c.flops, c.bytes, c.dtype, c.family) == (8 * 1024, 2 * 2 * 8 * 1024, "bf16", "elementwise")
    # copy_(dst, src): each side at its own dtype; the precision is the source's (an fp32 -> bf16 cast).
    c = per_call("aten::copy_", [[4, 256], [4, 256], []], [BF16, F32, "Scalar"])
    assert c.flops == 1024 and c.bytes == 1024 * 2 + 1024 * 4 and c.dtype == "fp32"
    # pow with a Scalar exponent is unary.
    c = per_call("aten::pow", [[10, 10], []], [F32, "Scalar"])
    assert c.flops == 100 and c.bytes == 2 * 100 * 4


def test_binary_ops_broadcast_and_scalars_move_no_bytes():
    # [16, 559, 1024] * [16, 559, 1]: the output has the first's shape; the second is read once, unbroadcast.
    c = per_call("aten::mul", [[16, 559, 1024], [16, 559, 1]], [BF16, BF16])
    n = 16 * 559 * 1024
    assert c.flops == n and c.bytes == 2 * n + 2 * 16 * 559 + 2 * n
    # add(a, b, alpha): the Scalar alpha is passed by value; a 0-dim double tensor (a wrapped Python float) is
    # one 8-byte element, and the output takes the dimensioned tensor's bf16.
    c = per_call("aten::add", [[64, 64], [64, 64], []], [BF16, BF16, "Scalar"])
    assert c.flops == 4096 and c.bytes == 3 * 2 * 4096
    c = per_call("aten::mul", [[1000], []], [BF16, "double"])
    assert c.flops == 1000 and c.bytes == 2 * 1000 + 8 + 2 * 1000
    # Broadcasting both ways: [4, 1] + [1, 5] -> [4, 5].
    c = per_call("aten::add", [[4, 1], [1, 5], []], [F32, F32, "Scalar"])
    assert c.flops == 20 and c.bytes == 4 * (4 + 5 + 20)
    c = per_call("aten::pow", [[3, 3], [3, 3]], [F32, F32])  # a tensor exponent is binary
    assert c.flops == 9 and c.bytes == 4 * 27
    with pytest.raises(ShapeError, match="do not broadcast"):
        per_call("aten::mul", [[4, 3], [4, 2]], [F32, F32])
    with pytest.raises(ShapeError, match="unknown element type"):
        per_call("aten::add", [[4], [4], []], ["c10::ComplexFloat", F32, "Scalar"])


def test_reductions_write_the_reduced_output():
    # mean over the last dim, keepdim: [16, 559, 1024] -> [16, 559, 1].
    c = per_call(
        "aten::mean", [[16, 559, 1024], [], [], []], [F32, "ScalarList", "Scalar", ""], ["", "[-1]", "True", ""]
    )
    assert c.flops == 16 * 559 * 1024 and c.bytes == 4 * (16 * 559 * 1024 + 16 * 559) and c.family == "reduction"
    # No dim argument (sum(x)): every dim, one output element.
    c = per_call("aten::sum", [[8, 16], []], [BF16, ""], ["", ""])
    assert c.flops == 128 and c.bytes == 2 * 128 + 2
    # argmax writes int64 indices; linalg_vector_norm's dim is its third argument.
    c = per_call("aten::argmax", [[32, 100], [], []], [BF16, "Scalar", "Scalar"], ["", "1", "False"])
    assert c.bytes == 2 * 3200 + 8 * 32
    c = per_call(
        "aten::linalg_vector_norm",
        [[6, 7, 8], [], [], [], []],
        [F32, "Scalar", "ScalarList", "Scalar", ""],
        ["", "2", "[0, 2]", "False", ""],
    )
    assert c.flops == 336 and c.bytes == 4 * (336 + 7)
    with pytest.raises(ShapeError, match="outside"):
        per_call("aten::sum", [[8, 16], [], []], [F32, "ScalarList", "Scalar"], ["", "[2]", "False"])


def test_softmax_counts_five_flops_and_its_fp32_output():
    c = per_call("aten::_softmax", [[2, 8, 128, 128], [], []], [BF16, "Scalar", "Scalar"], ["", "-1", "False"])
    n = 2 * 8 * 128 * 128
    assert c.flops == 5 * n and c.bytes == 2 * n + 2 * n and c.family == "softmax"
    c = per_call("aten::_softmax", [[2, 8, 128, 128], [], []], [BF16, "Scalar", "Scalar"], ["", "-1", "True"])
    assert c.bytes == 2 * n + 4 * n  # half_to_float: the output is fp32


def test_normalization_counts_statistics_affine_and_running_stats():
    n, C = 4 * 128 * 768, 768
    c = per_call(
        "aten::native_layer_norm",
        [[4, 128, 768], [], [C], [C], []],
        [BF16, "ScalarList", BF16, BF16, "Scalar"],
        ["", "[768]", "", "", "1e-05"],
    )
    assert c.flops == 8 * n and c.bytes == 2 * 2 * n + 2 * 2 * C and c.family == "normalization"
    # Without weight and bias: 6 FLOPs per element, input and output only.
    c = per_call("aten::native_layer_norm", [[4, 128, 768], [], [], [], []], [F32, "ScalarList", "", "", "Scalar"])
    assert c.flops == 6 * n and c.bytes == 2 * 4 * n
    # RMS norm: square, add, multiply, and the weight's multiply.
    c = per_call("aten::_fused_rms_norm", [[4, 128, 768], [], [C], []], [BF16, "ScalarList", BF16, "Scalar"])
    assert c.flops == 4 * n and c.bytes == 2 * 2 * n + 2 * C
    # Batch norm in training: statistics (6) + affine (2) per element; the running mean and variance (C each,
    # fp32) are read and written. In inference (training=False): normalize only (2) + affine (2).
    x, stats = [8, 16, 32, 32], [16]
    dims = [x, stats, stats, stats, stats, [], [], []]
    types = [F32] * 5 + ["Scalar"] * 3
    m = 8 * 16 * 32 * 32
    train = per_call("aten::native_batch_norm", dims, types, ["", "", "", "", "", "True", "0.1", "1e-05"])
    assert train.flops == 8 * m and train.bytes == 2 * 4 * m + 2 * 4 * 16 + 2 * 2 * 4 * 16
    infer = per_call("aten::native_batch_norm", dims, types, ["", "", "", "", "", "False", "0.1", "1e-05"])
    assert infer.flops == 4 * m and infer.bytes == train.bytes
    # Group norm: weight and bias at positions 1 and 2.
    c = per_call("aten::native_group_norm", [x, stats, stats, [], [], [], [], []], [F32] * 3 + ["Scalar"] * 5)
    assert c.flops == 8 * m and c.bytes == 2 * 4 * m + 2 * 4 * 16


def test_convolution_moves_input_weight_bias_and_output():
    # A ViT patch embedding: [128, 3, 224, 224] * [768, 3, 16, 16] stride 16 -> [128, 768, 14, 14].
    dims = [[128, 3, 224, 224], [768, 3, 16, 16], [768], [], [], [], [], [], []]
    concrete = ["", "", "", "[16, 16]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"]
    c = per_call(
        "aten::convolution", dims, [BF16] * 3 + ["ScalarList"] * 3 + ["Scalar", "ScalarList", "Scalar"], concrete
    )
    out = 128 * 768 * 14 * 14
    assert c.flops == 2 * out * 3 * 16 * 16 and c.family == "conv" and c.dtype == "bf16"
    assert c.bytes == 2 * (128 * 3 * 224 * 224 + 768 * 3 * 16 * 16 + 768 + out)
    # Transposed, stride 2, padding 1, output_padding 1: out = (8 - 1) * 2 - 2 + 2 + 1 + 1 = 16 per dim.
    t = per_call(
        "aten::convolution",
        [[1, 4, 8, 8], [4, 2, 3, 3], [], [], [], [], [], [], []],
        [F32, F32],
        ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "True", "[1, 1]", "1"],
    )
    assert t.flops == 2 * 1 * 64 * 4 * 9 * 2 and t.bytes == 4 * (4 * 64 + 4 * 2 * 9 + 2 * 16 * 16)
    with pytest.raises(ShapeError, match="Concrete Inputs"):
        per_call("aten::convolution", dims, [BF16] * 3, None)


def test_ops_without_a_model():
    with pytest.raises(ShapeError, match="no roofline model"):
        per_call("aten::upsample_nearest1d", [[1, 768, 8], [], []], [BF16, "ScalarList", ""])
    with pytest.raises(ShapeError, match="unknown element type"):
        per_call("aten::mm", [[4, 4], [4, 4]], ["c10::ComplexFloat"] * 2)
    assert per_call("aten::copy_", [[8], [8]], [I64, I64]).dtype is None  # integers have no FLOP peak
