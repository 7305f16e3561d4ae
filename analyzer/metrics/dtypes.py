"""Element types as traces spell them: bytes per element and the peak table's dtype key.

One table for every metric that reads a type: the roofline's bytes and
precision (analyzer.metrics.op_models), the FLOP counter's dtype
(analyzer.metrics.matmul_flops), activation sizes (analyzer.metrics.workload)
and collective message sizes (analyzer.metrics.stragglers, collectives).
"""

from __future__ import annotations

from typing import Iterable

# Kineto's "Input type" spellings (the C++ type names ATen records) -> (bytes per element, the peak table's
# dtype key; None: no peak, integer and boolean tensors).
INPUT_TYPES: dict[str, tuple[int, str | None]] = {
    "c10::BFloat16": (2, "bf16"),
    "c10::Half": (2, "fp16"),
    "float": (4, "fp32"),
    "double": (8, "fp64"),
    "c10::Float8_e4m3fn": (1, "fp8"),
    "c10::Float8_e5m2": (1, "fp8"),
    "c10::Float8_e4m3fnuz": (1, "fp8"),
    "c10::Float8_e5m2fnuz": (1, "fp8"),
    "long int": (8, None),
    "int": (4, None),
    "short int": (2, None),
    "signed char": (1, None),
    "unsigned char": (1, None),
    "bool": (1, None),
}

# The peak table's dtype key of each floating "Input type".
FLOAT_KEYS: dict[str, str] = {t: key for t, (_, key) in INPUT_TYPES.items() if key is not None}


def float_key(types: Iterable[object]) -> str | None:
    """The peak table's dtype key of the first floating type among an op's "Input type" list (its compute
    precision); None when no argument is a floating tensor."""
    for t in types:
        if isinstance(t, str) and t in FLOAT_KEYS:
            return FLOAT_KEYS[t]
    return None


# A collective message's dtype as the trace names it -> bytes per element: record_param_comms' ``dtype``
# (c10::ScalarType names: Float, BFloat16, Long, ...), torch/numpy names, and the "Input type" spellings
# (gloo's annotations carry their input's).
MESSAGE_DTYPE_BYTES: dict[str, int] = {
    **{t: size for t, (size, _) in INPUT_TYPES.items()},
    "Float": 4,
    "float32": 4,
    "Double": 8,
    "float64": 8,
    "Half": 2,
    "float16": 2,
    "BFloat16": 2,
    "bfloat16": 2,
    "Long": 8,
    "int64": 8,
    "Int": 4,
    "int32": 4,
    "Short": 2,
    "int16": 2,
    "Byte": 1,
    "uint8": 1,
    "Char": 1,
    "int8": 1,
    "Bool": 1,
}
