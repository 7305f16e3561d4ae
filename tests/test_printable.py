"""Control characters from trace content never reach a terminal, a CI log or a Markdown file raw
(analyzer/verbs/printable.py): kernel, op and annotation names and file and run names carrying ESC
sequences, NUL, C1 controls and bidi overrides are escaped in the text and Markdown output of report,
compare, check, suggest and history, and stay readable there; the JSON report keeps the real names."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synth import KinetoTrace
from test_cli import run_main
from test_history import GOOD, _copy

from analyzer.verbs.printable import printable

# What a crafted trace can carry: clear the screen and retitle the terminal (ESC, BEL), a CSI
# introducer as one C1 byte, a NUL, a carriage return that hides the start of a line, a right-to-left
# override and an isolate that make a name read backwards, and a newline that forges a CI log line.
EVIL_KERNEL = "sgemm\x1b[2J\x1b]0;pwned\x07_\x9b31m_kernel"
EVIL_OP = "aten::\u202emm\u2066x\u2069"
EVIL_ANNOTATION = "fwd\x00step\rHIDDEN\n::error::forged"
EVIL_FILE = "rank1\x1b[7m.json.gz"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def test_printable_escapes_controls_and_keeps_text() -> None:
    assert printable("a\x1b[2Jb\x00c\x9bd\u202ee\u2066f\u2069") == "a\\x1b[2Jb\\x00c\\x9bd\\u202ee\\u2066f\\u2069"
    assert printable("line 1\n\tline 2 …") == "line 1\n\tline 2 …"  # layout and non-control text kept
    assert printable("a\nb\tc\rd", one_line=True) == "a\\x0ab\\x09c\\x0dd"
    once = printable(EVIL_KERNEL + EVIL_OP + EVIL_ANNOTATION)
    assert printable(once) == once and not RAW.search(once)  # escaping twice changes nothing


def _write_run(folder: Path, extra_us: int) -> Path:
    """Two ranks, six 1000 us steps (+ `extra_us`), each with the crafted kernel, op and annotation;
    rank 1's file name carries an escape sequence."""
    folder.mkdir(parents=True)
    for rank, name in ((0, "rank0.json.gz"), (1, EVIL_FILE)):
        t = KinetoTrace(rank=rank, world_size=2)
        period = 1000 + extra_us
        for i in range(6):
            s = i * period
            t.step(10 + i, s, period)
            t.annotation(EVIL_ANNOTATION, s + 5, 400)
            t.cpu_op(EVIL_OP, s + 20, 50, input_dims=[[64, 64], [64, 64]], input_types=["float", "float"])
            t.kernel(EVIL_KERNEL, s + 100, 200 + extra_us, launch_us=s + 30)
            t.kernel(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                s + 350 + extra_us,
                100,
                stream=20,
                args=t.comm_args("allreduce", 1024),
                launch_us=s + 40,
            )
        t.write(folder / name)
    return folder


@pytest.fixture(scope="module")
def evil_runs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("printable")
    return _write_run(root / "base", 0), _write_run(root / "cand", 300)


def _strings(obj):
    """Every string in a JSON document (keys and values)."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def _assert_clean(text: str, *readable: str) -> None:
    found = RAW.search(text)
    assert found is None, f"raw {found.group()!r} in output: {text[max(0, found.start() - 60) : found.end() + 60]!r}"
    for piece in readable:
        assert piece in text, (piece, text[:2000])


def test_report_compare_check_suggest_escape_trace_names(evil_runs, capsys, tmp_path) -> None:
    base, cand = evil_runs
    code, out, err = run_main(capsys, "report", str(cand), "--no-cache", "--json", str(tmp_path / "r.json"))
    assert code == 0
    _assert_clean(out + err, "sgemm\\x1b[2J\\x1b]0;pwned\\x07_\\x9b31m_kernel")
    # The JSON report keeps the real name.
    doc = json.loads((tmp_path / "r.json").read_text())
    assert EVIL_KERNEL in set(_strings(doc))

    code, out, err = run_main(capsys, "compare", str(base), str(cand), "--no-cache")
    assert code == 0
    _assert_clean(out + err, "sgemm\\x1b[2J", "aten::\\u202emm\\u2066x\\u2069")

    summary = tmp_path / "summary.md"
    code, out, err = run_main(
        capsys, "check", str(cand), "--baseline", str(base), "--no-cache", "--summary", str(summary)
    )
    assert code == 1  # 300 us more kernel time in every 1000 us step: a regression far beyond any threshold
    _assert_clean(out + err + summary.read_text(encoding="utf-8"), "sgemm\\x1b[2J")

    code, out, err = run_main(capsys, "suggest", str(cand), "--no-cache")
    assert code == 0
    _assert_clean(out + err)


def test_warnings_naming_a_crafted_file_are_escaped(tmp_path, capsys) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    t = KinetoTrace(rank=0, world_size=2)
    t.kernel("sgemm", 100, 200, launch_us=30)  # no ProfilerStep: a warning naming the file
    t.write(folder / EVIL_FILE)
    code, out, err = run_main(capsys, "report", str(folder), "--no-cache")
    assert code == 0
    _assert_clean(out + err, "rank1\\x1b[7m.json.gz: no ProfilerStep markers")


def test_history_escapes_run_names(tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    _copy(GOOD, runs / "a\x1b[31mred", "2026-01-01T00:00:00+00:00", "sha01")
    shutil.copytree(runs / "a\x1b[31mred", runs / "b\u202eevil")
    code, out, err = run_main(capsys, "history", str(runs))
    assert code == 0
    _assert_clean(out + err, "a\\x1b[31mred", "b\\u202eevil")
