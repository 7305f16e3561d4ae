"""A reftrain run directory of 1,024 ranks, generated from a real 2-rank run,
read by the analyzer.

Many gloo ranks cannot run on 2 cores, so the files a 1,024-rank run would
write are generated from traces/example-ddp-w2 (a real 2-rank reftrain run):
rank R's metrics, collective records and trace are rank ``R % 2``'s, with
``rank`` rewritten, and ``run.json`` has ``world_size`` 1024 and one entry per
rank in ``clock.offsets_ns``, ``hardware.device_names`` and
``hardware.hostnames``, as reftrain's rank 0 writes them (docs/rundir.md,
the ``hardware`` and ``clock`` rows). The layout is reftrain's: one file per rank per family
(``metrics/rank{R}.jsonl``, ``collectives/rank{R}.jsonl``,
``traces/step{N}/rank{R}.pt.trace.json.gz``), no file shared by ranks.

Clocks: every rank gets a clock offset drawn from +-100 ms (hosts of a big
job disagree), written to ``clock.offsets_ns`` and added to that rank's
``start_ns``/``end_ns`` and ``time_ns``: the collective records are in each
rank's own clock, as reftrain writes them. The planted straggler (rank 700)
issues every collective 60 ms late on the common clock; every other rank
arrives within 0-2 ms (seeded jitter). The offsets are larger than the delay,
so the straggler is found only if the analyzer aligns the clocks. Step times
are the source rank's (in synchronous DDP the step times even out; the
lateness signal names the straggler).

Traces are kept small (the two ProfilerStep ranges, the c10d collective ops
and the metadata of the real trace; about 30 events per rank) so the test
parses 1,024 of them in seconds on 2 cores; tests/test_rundir.py and the
bench (bench/bench_scale.py) cover full traces.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

import orjson
import pytest

from analyzer.api import analyze

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "traces" / "example-ddp-w2"
WORLD = 1024
STRAGGLER = 700
DELAY_NS = 60_000_000
JITTER_NS = 2_000_000
OFFSET_NS = 100_000_000
SEED = 12


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _small_trace(doc: dict) -> dict:
    keep = [
        e
        for e in doc["traceEvents"]
        if e.get("ph") == "M"
        or e.get("cat") in ("Trace", "user_annotation")
        or str(e.get("name", "")).startswith("c10d::")
    ]
    return dict(doc, traceEvents=keep)


def make_run_dir(dst: Path, world: int = WORLD, straggler: int = STRAGGLER) -> dict:
    """Write a ``world``-rank run directory at ``dst`` from the 2-rank example; returns its run.json."""
    man = json.loads((SOURCE / "run.json").read_text())
    rng = random.Random(SEED)
    offsets = [0] + [rng.randint(-OFFSET_NS, OFFSET_NS) for _ in range(world - 1)]
    src_metrics = {r: _jsonl(SOURCE / "metrics" / f"rank{r}.jsonl") for r in (0, 1)}
    src_colls = {r: _jsonl(SOURCE / "collectives" / f"rank{r}.jsonl") for r in (0, 1)}
    src_traces = {}
    for r in (0, 1):
        (trace,) = (SOURCE / "traces").glob(f"rank{r}.step*.json.gz")
        src_traces[r] = _small_trace(orjson.loads(gzip.decompress(trace.read_bytes())))
    window = int(str(trace.name).split(".step")[1].split(".")[0])
    # Common clock of a collective: rank 0's record (its offset is 0 by definition).
    common = {c["seq"]: c["start_ns"] for c in src_colls[0]}
    for family in ("metrics", "collectives", f"traces/step{window}"):
        (dst / family).mkdir(parents=True)
    shutil.copy(SOURCE / "config.yaml", dst / "config.yaml")
    files = {
        "config": "config.yaml",
        "metrics": [],
        "collectives": [],
        "telemetry": [],
        "traces": [],
        "checkpoints": [],
    }
    for rank in range(world):
        src = rank % 2
        off = offsets[rank]
        lines = []
        for rec in src_metrics[src]:
            lines.append(orjson.dumps(dict(rec, rank=rank, time_ns=rec["time_ns"] - offsets[src] + off)))
        (dst / "metrics" / f"rank{rank}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        lines = []
        for rec in src_colls[src]:
            late = DELAY_NS if rank == straggler else rng.randint(0, JITTER_NS)
            start = common[rec["seq"]] + late + off  # this rank's clock
            dur = rec["end_ns"] - rec["start_ns"]
            lines.append(orjson.dumps(dict(rec, rank=rank, group_size=world, start_ns=start, end_ns=start + dur)))
        (dst / "collectives" / f"rank{rank}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        doc = dict(src_traces[src])
        info = dict(doc["distributedInfo"], rank=rank, world_size=world)
        info["pg_config"] = [dict(pg, pg_size=world, ranks=list(range(world))) for pg in info.get("pg_config", [])]
        doc["distributedInfo"] = info
        rel = f"traces/step{window}/rank{rank}.pt.trace.json.gz"
        (dst / rel).write_bytes(gzip.compress(orjson.dumps(doc), compresslevel=1))
        files["metrics"].append(f"metrics/rank{rank}.jsonl")
        files["collectives"].append(f"collectives/rank{rank}.jsonl")
        files["traces"].append(rel)
    hw = man["hardware"]
    man.update(
        run_id=dst.name,
        world_size=world,
        command=[a if a != "2" else str(world) for a in man["command"]],
        hardware=dict(
            hw,
            device_names=[hw["device_names"][r % 2] for r in range(world)],
            hostnames=[f"node{r // 8:03d}" for r in range(world)],
        ),
        clock=dict(man["clock"], offsets_ns=offsets),
        files=files,
    )
    (dst / "run.json").write_text(json.dumps(man, indent=2) + "\n")
    return man


@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("scale") / "ddp-w1024"
    make_run_dir(dst)
    return dst


def without_traces(run: Path, dst: Path, offsets_ns: list[int] | None = None) -> Path:
    """A copy of ``run`` as a run with the profiler off (no traces; ``files.traces`` empty),
    optionally with other ``clock.offsets_ns``."""
    man = json.loads((run / "run.json").read_text())
    man["files"]["traces"] = []
    if offsets_ns is not None:
        man["clock"]["offsets_ns"] = offsets_ns
    dst.mkdir(parents=True)
    for name in ("metrics", "collectives"):
        shutil.copytree(run / name, dst / name)
    shutil.copy(run / "config.yaml", dst / "config.yaml")
    (dst / "run.json").write_text(json.dumps(man))
    return dst


@pytest.fixture(scope="module")
def big_analysis(big_run, tmp_path_factory):
    """The records of the 1,024 ranks (metrics, collectives, clock), without the
    traces: about 2 s. Reading 1,024 traces as well takes 30-60 s on 2 cores (the
    analyzer's fixed cost per rank summary, about 30-60 ms however small the
    trace), so that check is the slow test at the end of this file."""
    return analyze(without_traces(big_run, tmp_path_factory.mktemp("records") / "ddp-w1024"), cache=False)


def test_layout_one_file_per_rank(big_run):
    """Every per-rank family has exactly one file per rank, and run.json's lists one entry per rank."""
    man = json.loads((big_run / "run.json").read_text())
    assert man["world_size"] == WORLD
    for family, pattern in (
        ("metrics", "metrics/rank*.jsonl"),
        ("collectives", "collectives/rank*.jsonl"),
        ("traces", "traces/step*/rank*.pt.trace.json.gz"),
    ):
        on_disk = sorted(str(p.relative_to(big_run)) for p in big_run.glob(pattern))
        assert on_disk == sorted(man["files"][family])
        assert len(on_disk) == WORLD
    assert len(man["clock"]["offsets_ns"]) == WORLD
    assert len(man["hardware"]["hostnames"]) == WORLD


def test_analyzer_reads_all_ranks(big_analysis):
    ra = big_analysis
    assert ra.kind == "reftrain"
    assert ra.errors == []
    assert ra.to_json()["run"]["world_size"] == WORLD
    assert sorted(ra.metrics["rank"].unique()) == list(range(WORLD))
    # Every rank matched at every collective of the 5 judged steps (one
    # all-reduce per step; warm-up, profiled and after-trace steps left out).
    per_rank = {r.rank: r for r in ra.stragglers.per_rank}
    assert sorted(per_rank) == list(range(WORLD))
    assert {r.n_collectives for r in per_rank.values()} == {5}
    assert {r.n_steps for r in per_rank.values()} == {5}


def test_planted_straggler_named_with_aligned_clocks(big_analysis):
    """Rank 700 arrives 60 ms late at every collective; the clock offsets
    (up to +-100 ms) hide it unless the analyzer subtracts them."""
    s = big_analysis.stragglers
    assert s.ranks == [STRAGGLER]
    assert "clocks aligned with clock.offsets_ns" in s.arrival_source
    rank = next(r for r in s.per_rank if r.rank == STRAGGLER)
    assert rank.signals == ["lateness"]
    # Per step it is 60 ms late vs a median other rank's 1 ms (U(0, 2 ms)): the excess lies in (58, 60] ms.
    assert 58.0 < rank.lateness_excess_ms <= 60.0
    assert rank.last_arrivals == rank.n_collectives


def test_unaligned_clocks_would_hide_the_straggler(big_run, tmp_path):
    """The negative control: the same records read with every offset zeroed
    do not name rank 700 (so the test above really exercises alignment)."""
    run = without_traces(big_run, tmp_path / "zeroed", offsets_ns=[0] * WORLD)
    assert STRAGGLER not in analyze(run, cache=False).stragglers.ranks


@pytest.mark.slow
def test_analyzer_reads_1024_traces(big_run):
    """The whole run directory, a trace per rank included (30-60 s: see big_analysis)."""
    ra = analyze(big_run, cache=False)
    assert ra.errors == []
    assert [r.rank for r in ra.ranks] == list(range(WORLD))
    assert all(r.source is not None and r.n_steps == 2 for r in ra.ranks)  # both ProfilerSteps of every rank's trace
    assert ra.stragglers.ranks == [STRAGGLER]
