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
    assert conv_flops("aten::conv2d", [[2, 8, 10, 10], [16, 4, 3, 3]], ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "2"]) \
        == 2 * 2 * 100 * 16 * 9 * 4
    # dilation 2: effective kernel 5, out (10 - 5) + 1 = 6.
    assert conv_flops("aten::conv2d", [[1, 4, 10, 10], [4, 4, 3, 3]], ["", "", "", "[1, 1]", "[0, 0]", "[2, 2]", "1"]) \
        == 2 * 36 * 4 * 9 * 4
    # padding="same" (stride 1).
    assert conv_flops("aten::conv1d", [[1, 4, 7], [6, 4, 3]], ["", "", "", "[1]", "same", "[1]", "1"]) == 2 * 7 * 6 * 3 * 4
    # cudnn_convolution's own argument order (padding before stride).
    assert conv_flops("aten::cudnn_convolution", [[1, 3, 9, 9], [5, 3, 3, 3]], ["", "", "[0, 0]", "[2, 2]", "[1, 1]", "1"]) \
        == 2 * 16 * 5 * 27
    # transposed: weight [C_in, C_out/groups, k], FLOPs over the input's spatial dims.
    assert conv_flops("aten::conv_transpose2d", [[1, 4, 5, 5], [4, 3, 2, 2]], ["", "", "", "[2, 2]", "[0, 0]", "[0, 0]", "1", "[1, 1]"]) \
        == 2 * 25 * 4 * 4 * 3
    assert conv_flops("aten::convolution", [[1, 4, 5, 5], [4, 3, 2, 2]],
                      ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "True", "[0, 0]", "1"]) == 2 * 25 * 4 * 4 * 3


@pytest.mark.parametrize(
    "name,dims,concrete",
    [
        ("aten::conv2d", [[1, 3, 8, 8], [4, 2, 3, 3]], ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "1"]),  # channels disagree
        ("aten::conv2d", [[1, 4, 8, 8], [4, 2, 3, 3]], ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "3"]),  # groups do not fit
        ("aten::conv2d", [[1, 3, 2, 2], [4, 3, 3, 3]], ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "1"]),  # output < 1
        ("aten::conv2d", [[1, 3, 8, 8], [4, 3, 3]], ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "1"]),     # weight rank
        ("aten::conv2d", [[1, 3, 8, 8], [4, 3, 3, 3]], ["", "", "", "[1, 1, 1]", "[0, 0]", "[1, 1]", "1"]),  # stride length
        ("aten::conv2d", [[1, 3, 8, 8], [4, 3, 3, 3]], ["", "", "", "[2, 2]", "same", "[1, 1]", "1"]),    # same + stride
        ("aten::mm", [[2, 3], [3, 4]], []),
    ],
)
def test_shapes_that_do_not_fit_raise(name, dims, concrete) -> None:
    with pytest.raises(ShapeError):
        conv_flops(name, dims, concrete)
