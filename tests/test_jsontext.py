"""analyzer.jsontext: the one JSON sanitizer of every ``to_json``, the one text
of a document's input, and the writer."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path, PurePosixPath

import numpy as np
import pandas as pd
import pytest

from analyzer.jsontext import dumps_json, jsonable, path_text


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), -float("inf"), np.float64("nan"), np.float32("inf"), pd.NA, pd.NaT, None]
)
def test_not_a_number_and_missing_become_null(value):
    assert jsonable(value) is None


def test_numpy_scalars_become_python_values_of_their_kind():
    out = jsonable(
        [np.int64(3), np.int32(-1), np.uint8(7), np.float64(2.5), np.float32(0.5), np.bool_(True), np.bool_(False)]
    )
    assert out == [3, -1, 7, 2.5, 0.5, True, False]
    assert [type(v) for v in out] == [int, int, int, float, float, bool, bool]


def test_python_values_are_kept_exactly():
    out = jsonable({"i": 3, "f": 1.25, "b": False, "s": "12", "n": None, "big": 2**63})
    assert out == {"i": 3, "f": 1.25, "b": False, "s": "12", "n": None, "big": 2**63}
    assert type(out["i"]) is int and type(out["b"]) is bool and type(out["s"]) is str  # a numeric string stays text


def test_arrays_containers_and_keys():
    value = {
        1: (np.array([1.0, np.nan, np.inf]), [np.int64(2), {"x": np.float64("nan")}]),
        "p": Path("/runs/a"),
        "q": PurePosixPath("rel/b"),
        "m": np.array([[1, 2], [3, 4]]),
    }
    assert jsonable(value) == {
        "1": [[1.0, None, None], [2, {"x": None}]],
        "p": "/runs/a",
        "q": "rel/b",
        "m": [[1, 2], [3, 4]],
    }


def test_a_frame_of_records_round_trips_through_the_writer():
    frame = pd.DataFrame(
        {
            "rank": np.array([0, 1], dtype=np.int64),
            "ms": [1.5, np.nan],
            "ok": [True, False],
            "n": pd.array([1, None], dtype="Int64"),
        }
    )
    records = jsonable(frame.to_dict("records"))
    assert records == [{"rank": 0, "ms": 1.5, "ok": True, "n": 1}, {"rank": 1, "ms": None, "ok": False, "n": None}]
    assert json.loads(dumps_json(records)) == records
    assert "NaN" not in dumps_json(jsonable({"x": float("nan")}))


def test_path_text_names_one_input_or_several():
    assert path_text(Path("runs/a")) == "runs/a"
    assert path_text("runs/a") == "runs/a"
    assert path_text([Path("a.json"), "b.json"]) == "a.json, b.json"


def test_finite_floats_are_not_rounded():
    x = 0.1 + 0.2
    assert jsonable(x) == x and jsonable(np.float64(x)) == x and math.isfinite(jsonable(1e308))


def test_jsontext_loads_neither_numpy_nor_pandas():
    """analyzer report answers from its cache without them (analyzer.verbs.report_cache)."""
    code = (
        "import sys, analyzer.jsontext as j; j.jsonable({'a': [1.0, float('nan')]}); "
        "print(sorted(m for m in ('numpy', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
