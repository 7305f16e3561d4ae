"""The one set of formatters every renderer uses (analyzer/render/format.py): exact strings."""

from __future__ import annotations

import math

from analyzer.render.format import (
    KERNEL_NAME_WIDTH,
    mib,
    num,
    pct,
    points_change,
    short_kernel_name,
    value_text,
)


def test_missing_numbers_print_as_a_dash_everywhere():
    assert [num(None), num(math.nan), num(math.inf), pct(None), pct(math.nan), mib(None), value_text("mfu", None)] == [
        "-"
    ] * 7
    assert (num(1.25, ".1f"), pct(0.4551), pct(0.4551, 2), mib(3 * 2**20 + 2**19)) == ("1.2", "45.5%", "45.51%", "3.5")


def test_gated_values_in_their_units():
    assert value_text("mfu", 0.45517) == "45.52%"
    assert value_text("tokens_per_s", 12345.6) == "12,346 tokens/s"
    assert value_text("steps_per_s", 1.23456) == "1.235 steps/s"
    assert value_text("cpu_steps_per_s", 1.23456) == "1.23 steps/CPU-s"


def test_points_change_is_the_difference_of_the_figures_shown():
    # 62.904% and 52.226% print as 62.90% and 52.23%: the change shown is -10.67, not -10.678 rounded (-10.68).
    assert (pct(0.62904, 2), pct(0.52226, 2)) == ("62.90%", "52.23%")
    assert points_change(0.62904, 0.52226) == "-10.67"
    assert points_change(0.5, 0.5000001) == "+0.00"  # never "-0.00"
    assert points_change(None, 0.5) == "-"


def test_short_kernel_names_keep_head_and_tail():
    assert short_kernel_name("ampere_sgemm_128x64_nn") == "ampere_sgemm_128x64_nn"
    # A CUTLASS 3 kernel as Kineto reports it: about 2,000 characters; the parameter list goes, then the middle.
    tmpl = ", ".join(f"cute::C<{i}>" for i in range(150))
    long = (
        f"void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, {tmpl}>>"
        f"(cutlass::gemm::kernel::GemmUniversal<{tmpl}>::Params)"
    )
    short = short_kernel_name(long)
    assert len(short) == KERNEL_NAME_WIDTH == 72
    head, tail = short.split("…")
    assert head == "cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<"[: len(head)] and len(head) == 42
    assert tail == "C<147>, cute::C<148>, cute::C<149>>>"[-len(tail) :] and len(tail) == 29
    # A signature loses its parameter list; a name with a parenthesized note that is no signature keeps it.
    assert (
        short_kernel_name("void at::native::elementwise_kernel<128, 2>(int, float*)")
        == "at::native::elementwise_kernel<128, 2>"
    )
    assert short_kernel_name("Memcpy HtoD (Pinned -> Device)") == "Memcpy HtoD (Pinned -> Device)"
    assert short_kernel_name("evil\x1b[2Jname") == "evil\\x1b[2Jname"
