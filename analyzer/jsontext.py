"""The JSON every analyzer document is made of and written as: one sanitizer
(:func:`jsonable`), the text naming a document's input (:func:`path_text`),
and the writer (:func:`dumps_json`).

No pandas or numpy import here: ``analyzer report`` replays cached reports
without loading them. A numpy or pandas value can only exist once its
library is loaded, so :func:`jsonable` looks them up in ``sys.modules``.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any

import orjson


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON values, recursively; the one sanitizer of every ``to_json``.

    * float NaN, inf and -inf (Python or numpy) -> None; other floats -> float;
    * numpy integers -> int, numpy bools -> bool, numpy arrays -> lists (each item sanitized);
    * pandas ``NA`` and ``NaT`` -> None;
    * paths -> their text (``str``);
    * mappings -> dicts with ``str`` keys, lists and tuples -> lists;
    * None, bool, int and str as they are; anything else is left for the writer
      (orjson), which raises on what it cannot write.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):  # numpy's float64 too (a float subclass): made a Python float
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.floating):
            f = float(value)
            return f if math.isfinite(f) else None
        if isinstance(value, np.ndarray):
            return [jsonable(v) for v in value.tolist()]
    pd = sys.modules.get("pandas")
    if pd is not None and (value is pd.NA or value is pd.NaT):
        return None
    return value


def path_text(path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> str:
    """A document's input as one line: the path, or several joined by ``", "``."""
    if isinstance(path, (str, os.PathLike)):
        return str(path)
    return ", ".join(str(p) for p in path)


def dumps_json(obj: Any) -> str:
    """Indented JSON text (NaN never appears: the producers map it to null with :func:`jsonable`)."""
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode() + "\n"


__all__ = ["dumps_json", "jsonable", "path_text"]
