"""Cross-rank clock alignment at start-up.

Collective records carry each rank's own `time.time_ns()`. To compare them
across ranks (arrival skew, docs/rundir.md) we estimate, once after
`init_process_group`, every rank's clock offset from rank 0's.

Method (barrier bracketing). Every rank reads its clock just before and just
after a blocking all-reduce of one element. The all-reduce cannot complete on
any rank before the last rank has called it, and every rank has called it by
then; so that instant T lies inside every rank's bracket: in rank r's clock
before_r <= T_r <= after_r. With offset_r = T_r - T_0 it follows that

    before_r - after_0  <=  offset_r  <=  after_r - before_0

for every round. Assuming the offset is constant over the few milliseconds of
measurement, the intersection of the rounds' intervals bounds it; the
estimate is the intersection's midpoint and the uncertainty its half width
(an honest bound, not a standard deviation). If the intervals do not
intersect (a clock step during measurement), the narrowest single round is
used instead. This is the bound NTP's offset/delay computation gives for a
symmetric exchange (RFC 5905, section 8), applied to a barrier.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from recorder.instrument import untimed_collectives


@dataclass
class ClockSync:
    """Clock offsets of all ranks relative to rank 0 (ns); subtract to align."""

    offsets_ns: list[int]  # per rank: that rank's clock minus rank 0's clock
    uncertainty_ns: int  # max over ranks of the half width of the offset's bound
    method: str

    def to_dict(self) -> dict:
        """The manifest's `clock` object: method, offsets_ns, uncertainty_ns."""
        return asdict(self)


def estimate_offsets(brackets_ns: Sequence[Sequence[tuple[int, int]]]) -> tuple[list[int], int]:
    """Offsets (rank clock minus rank 0 clock) and uncertainty from barrier brackets.

    `brackets_ns[r][k]` is rank r's (before_ns, after_ns) around round k's
    barrier, in rank r's clock. Returns (offsets_ns per rank, max half width over ranks 1..N-1).
    Pure function; see the module docstring for the bound it uses.
    """
    ref = brackets_ns[0]
    offsets = [0]  # rank 0 against itself: zero by definition, exactly
    uncertainty = 0
    for rank_brackets in brackets_ns[1:]:
        intervals = [
            (before - ref_after, after - ref_before)
            for (before, after), (ref_before, ref_after) in zip(rank_brackets, ref, strict=True)
        ]
        lo = max(iv[0] for iv in intervals)
        hi = min(iv[1] for iv in intervals)
        if lo > hi:  # inconsistent rounds (clock stepped): trust the tightest one
            lo, hi = min(intervals, key=lambda iv: iv[1] - iv[0])
        offsets.append((lo + hi) // 2)
        uncertainty = max(uncertainty, (hi - lo + 1) // 2)
    return offsets, uncertainty


def align_clocks(rounds: int = 8) -> ClockSync:
    """Measure every rank's clock offset from rank 0. Collective: call on all ranks.

    Works with gloo (CPU tensors) and NCCL (CUDA tensors, with a device
    synchronize so the host read follows the collective's completion).
    Without an initialized process group returns offsets [0].
    Collectives used here are not recorded by an installed CollectiveTimer.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return ClockSync(offsets_ns=[0], uncertainty_ns=0, method="single process: no clock offset")
    if rounds < 1:
        raise ValueError("align_clocks needs at least one round")
    cuda = "nccl" in str(dist.get_backend()).lower()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    token = torch.zeros(1, device=device)

    def blocking_barrier() -> None:
        dist.all_reduce(token)
        if cuda:
            torch.cuda.synchronize(device)

    mine = torch.empty(rounds, 2, dtype=torch.int64)
    with untimed_collectives():
        blocking_barrier()  # first contact (connection setup, stragglers from init) outside the rounds
        for k in range(rounds):
            blocking_barrier()  # line ranks up so the measured barrier is tight
            before_ns = time.time_ns()
            blocking_barrier()
            after_ns = time.time_ns()
            mine[k, 0] = before_ns
            mine[k, 1] = after_ns
        world = dist.get_world_size()
        gathered = [torch.empty_like(mine, device=device) for _ in range(world)]
        dist.all_gather(gathered, mine.to(device))
    brackets = [[(int(b), int(a)) for b, a in g.cpu().tolist()] for g in gathered]
    offsets, uncertainty = estimate_offsets(brackets)
    what = "all_reduce + cuda synchronize" if cuda else "all_reduce (gloo, blocking)"
    method = (
        f"barrier bracketing: time.time_ns() before/after a blocking {what}, "
        f"offset bounds intersected over {rounds} rounds, midpoint"
    )
    return ClockSync(offsets_ns=offsets, uncertainty_ns=uncertainty, method=method)
