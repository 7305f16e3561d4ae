"""What the critical path costs (docs/metrics.md, "Critical path": "Cost, so on request"), side by side in one process.

    .venv/bin/python bench/bench_critical_path.py [--trace PATH] [--repeats 7]

On one trace (default ``../shared/traces/hta-samples/trace_diff/control``, else the repository's
``traces/example-ddp-w2``), interleaved in every repeat so that load drift hits both sides alike:

1. **The report**: ``analyze(PATH, cache=False)`` against ``analyze(PATH, cache=False,
   critical_path=True)``, the analysis a cold ``analyzer report`` makes, in process CPU time
   (``time.process_time``: the map runs in this process for one trace file).
2. **The paths**: ``critical_paths(trace)`` of the loaded trace, per profiled step.
3. **The topological order** of each step's graph: ours (``depgraph.topological_order``, time order
   with same-time ties broken by chain level, vectorized) against the standard library's
   ``graphlib.TopologicalSorter`` on the same graph (any topological order gives the same paths:
   tests/test_topological_order.py).

Prints the medians and the ratios (with / without; graphlib / ours).
"""

from __future__ import annotations

import argparse
import graphlib
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from analyzer.api import analyze  # noqa: E402
from analyzer.ingest.load import load_trace  # noqa: E402
from analyzer.metrics.critical_path import critical_paths  # noqa: E402
from analyzer.metrics.depgraph import StepGraph, build_step_graph, topological_order  # noqa: E402

SHARED = REPO.parent / "shared" / "traces" / "hta-samples" / "trace_diff" / "control"
FALLBACK = REPO / "traces" / "example-ddp-w2"


def graphlib_order(g: StepGraph) -> list[int]:
    """A topological order of ``g`` by the standard library, which knows nothing of the nodes' times."""
    sorter: graphlib.TopologicalSorter = graphlib.TopologicalSorter()
    for v in range(len(g.node_ts_ns)):
        sorter.add(v)
    for s, d in zip(g.edge_src.tolist(), g.edge_dst.tolist()):
        sorter.add(d, s)
    return list(sorter.static_order())


def cpu_s(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, help=f"a trace folder or file (default {SHARED}, else {FALLBACK})")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    path = args.trace or (SHARED if SHARED.exists() else FALLBACK)
    files = sorted(path.rglob("*.json*")) if path.is_dir() else [path]
    rt = load_trace(files[0])
    steps = rt.steps["step"].tolist()
    if not steps:
        print(f"bench_critical_path: {files[0]}: no ProfilerStep# in the trace, nothing to measure", file=sys.stderr)
        return 2
    graphs = [build_step_graph(rt, int(s)) for s in steps]
    without, with_paths, paths, ours, stdlib = [], [], [], [], []
    for i in range(args.repeats):
        pair = [
            ("without", lambda: analyze(path, cache=False)),
            ("with", lambda: analyze(path, cache=False, critical_path=True)),
        ]
        for name, fn in pair if i % 2 == 0 else pair[::-1]:
            (without if name == "without" else with_paths).append(cpu_s(fn))
        paths.append(cpu_s(lambda: critical_paths(rt)) / len(steps))
        ours.append(statistics.median(cpu_s(lambda g=g: topological_order(g)) for g in graphs))
        stdlib.append(statistics.median(cpu_s(lambda g=g: graphlib_order(g)) for g in graphs))
    med = statistics.median
    nodes = med(len(g.node_ts_ns) for g in graphs)
    print(
        f"bench_critical_path: {path} (rank {rt.rank}, {len(rt.events)} events, {len(steps)} steps, "
        f"median {nodes:.0f} graph nodes a step), {args.repeats} repeats, CPU time, medians"
    )
    print(f"  analysis without the paths   {med(without):8.3f} s")
    print(f"  analysis with the paths      {med(with_paths):8.3f} s   ratio {med(with_paths) / med(without):.2f}")
    print(f"  critical_paths, per step     {med(paths) * 1e3:8.1f} ms")
    print(f"  topological order: graphlib  {med(stdlib) * 1e3:8.2f} ms a step")
    print(
        f"  topological order: ours      {med(ours) * 1e3:8.2f} ms a step   graphlib / ours {med(stdlib) / med(ours):.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
