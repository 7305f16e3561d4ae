"""reftrain's progress lines (reftrain/train.py, docs/reftrain.md "What a step records"): which steps print,
the ETA and the line itself, on synthetic records with exact answers (nothing is timed here; the real
2-rank run's lines are checked in tests/test_reftrain_run.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # reftrain.train imports torch (the train extra)

from reftrain.config import Config, resolve
from reftrain.errors import ReftrainError
from reftrain.train import ETA_WINDOW, eta_s, prints_after, progress_line


@pytest.mark.parametrize(
    ("start", "steps", "every", "printed"),
    [
        (0, 20, 10, [0, 9, 19]),  # steps 1, 10 and 20 done
        (0, 10, 3, [0, 2, 5, 8, 9]),
        (7, 25, 10, [7, 9, 19, 24]),  # resumed at step 7: its first step, then the same steps as a fresh run
        (0, 5, 1, [0, 1, 2, 3, 4]),
        (0, 20, 0, []),
    ],
)
def test_which_steps_print(start: int, steps: int, every: int, printed: list[int]) -> None:
    assert [s for s in range(start, steps) if prints_after(s, start, steps, every)] == printed


def _records(n: int, profiled: set[int]) -> list[dict]:
    # Warm-up steps far slower, profiled steps slower: neither may reach the ETA's median.
    return [
        {
            "step": s,
            "step_time_ms": 100.0 + s + (5000 if s < 3 else 0) + (900 if s in profiled else 0),
            "profiled": s in profiled,
        }
        for s in range(n)
    ]


def test_eta_is_the_median_of_the_last_steady_steps_times_the_steps_left() -> None:
    assert ETA_WINDOW == 10
    # Steady steps (warm-up 3, profiled 5-6): 3, 4, 7..14; median of 103, 104, 107..114 = (109 + 110) / 2.
    assert eta_s(_records(15, {5, 6}), 0, 3, 20) == pytest.approx(109.5 * 5 / 1e3)
    # 13 steady steps (3, 4, 7..17): the last 10 are 8..17, median 112.5 ms, 2 steps left.
    assert eta_s(_records(18, {5, 6}), 0, 3, 20) == pytest.approx(112.5 * 2 / 1e3)
    # A resumed attempt's warm-up counts from its own first step.
    assert eta_s(_records(15, set())[10:], 10, 3, 20) == pytest.approx(113.5 * 5 / 1e3)


def test_eta_is_withheld_before_a_steady_step_and_after_the_last() -> None:
    assert eta_s(_records(3, set()), 0, 3, 20) is None  # warm-up only
    assert eta_s(_records(6, {3, 4, 5}), 0, 3, 20) is None  # the rest in the profiler
    assert eta_s(_records(20, set()), 0, 3, 20) is None  # done


def test_the_line() -> None:
    r = {"step": 9, "loss": 5.12345, "step_time_ms": 312.44, "tokens_per_s": 1650.0, "mfu": 0.4123, "profiled": False}
    assert progress_line(r, 20, 2, 3725.4) == "step 10/20  loss 5.1235    312.4 ms  3.3k tok/s  MFU 41.2%  ETA 1:02:05"
    assert progress_line(r | {"step": 0, "profiled": True}, 20, 1, None) == (
        "step  1/20  loss 5.1235    312.4 ms  1.6k tok/s  MFU 41.2%  [profiler]"
    )


def test_interval_is_checked() -> None:
    cfg = Config()
    cfg.log.console_interval_steps = -1
    with pytest.raises(ReftrainError, match="log.console_interval_steps"):
        resolve(cfg, 1)
