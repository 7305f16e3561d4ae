"""The JSON text every analyzer document is written as (no pandas here:
``analyzer report`` replays cached reports without importing it)."""
from __future__ import annotations

from typing import Any

import orjson


def dumps_json(obj: Any) -> str:
    """Indented JSON text (NaN never appears: the producers map it to null)."""
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode() + "\n"
