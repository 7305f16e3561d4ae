"""The events table's columns and the event kinds, without pandas.

Pure Python, so that the parser's worker processes and the CLI's start-up
path (which parses traces while pandas is still being imported, see
analyzer/ingest/parse/) can use them; :mod:`analyzer.ingest.tables` re-exports every
name and documents the columns.
"""

from __future__ import annotations

import re
import zlib

# Device-side kinds (events that run on a GPU stream) and host-side kinds.
DEVICE_KINDS = ("compute", "comm", "memcpy", "memset")
HOST_KINDS = ("cpu_op", "cpu_comm", "annotation", "runtime", "other")
KINDS = DEVICE_KINDS + HOST_KINDS

# HTA matches "nccl" by prefix in places and misses ``ncclDevKernel_*``;
# we match nccl/rccl anywhere, case-insensitively.
# Searched in the lower-cased name (Python's re with IGNORECASE is several times slower on kernel
# names of a few hundred characters; classify runs once per distinct (category, name) of every trace).
COMM_KERNEL_RE = re.compile(r"nccl|rccl")
# Host-side collective ops: c10d dispatcher ops, gloo/nccl annotations and
# record_param_comms, the marker PyTorch emits around every collective.
CPU_COMM_RE = re.compile(r"^(c10d::|record_param_comms$|gloo:|nccl:|c10d_functional::)", re.IGNORECASE)
# The op names of the FLOP table (analyzer.metrics.flop_table holds their formulas; a test holds the two
# equal). The loader keeps these ops' shapes and scalar arguments. GEMMs, with scaled (fp8) and grouped (MoE)
# matmuls; the outer scaled_dot_product_attention is here too, as the MFU's first FLOP op.
MATMUL_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::matmul",
        "aten::linear",
        "aten::_scaled_mm",
        "aten::_grouped_mm",
        "aten::_scaled_grouped_mm",
        "aten::scaled_dot_product_attention",
    }
)
# Convolution ops whose FLOPs need their scalar arguments (stride, padding,
# dilation, groups, transposed) from ``Concrete Inputs``; the backend ops
# (cudnn, miopen, mkldnn) count when no outer op records them.
CONV_OPS = frozenset(
    {
        "aten::convolution",
        "aten::_convolution",
        "aten::conv1d",
        "aten::conv2d",
        "aten::conv3d",
        "aten::cudnn_convolution",
        "aten::cudnn_convolution_transpose",
        "aten::conv_transpose1d",
        "aten::conv_transpose2d",
        "aten::conv_transpose3d",
        "aten::mkldnn_convolution",
        "aten::miopen_convolution",
        "aten::miopen_depthwise_convolution",
        "aten::miopen_convolution_transpose",
        "aten::_slow_conv2d_forward",
    }
)
# Convolution gradients (their ``output_mask`` says which of input and weight gradient they compute).
CONV_BACKWARD_OPS = frozenset(
    f"aten::{n}"
    for n in (
        "convolution_backward",
        "convolution_backward_overrideable",
        "cudnn_convolution_backward",
        "cudnn_convolution_transpose_backward",
        "miopen_convolution_backward",
        "miopen_convolution_transpose_backward",
        "miopen_depthwise_convolution_backward",
    )
)
# Scaled-dot-product attention and the backend ops it dispatches to, which launch its kernels (a kernel
# counts to the innermost op: analyzer.metrics.attribution). Their ``Concrete Inputs`` carry ``is_causal``.
ATTENTION_OPS = frozenset(
    {
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
    }
)
# Attention ops below (or instead of) those: the math backend (bmm and softmax ops inside it) and the
# kernels' own entry points, which compiled graphs call with no SDPA op around them. In the FLOP table; the
# kernel attribution keeps the SDPA op above them, as TraceLens's SDPA rows do.
ATTENTION_INNER_OPS = frozenset(
    {"aten::_scaled_dot_product_attention_math", "aten::_flash_attention_forward", "aten::_efficient_attention_forward"}
)
ATTENTION_BACKWARD_OPS = frozenset(
    f"aten::{n}"
    for n in (
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward",
        "_flash_attention_backward",
        "_efficient_attention_backward",
    )
)
FLOP_OPS = MATMUL_OPS | CONV_OPS | CONV_BACKWARD_OPS | ATTENTION_OPS | ATTENTION_INNER_OPS | ATTENTION_BACKWARD_OPS
# The memory-bound families the roofline models (analyzer.metrics.op_models): the ATen ops that launch their
# kernels (aten::gelu's kernel, aten::copy_'s for .to()/.contiguous()/clone, aten::native_layer_norm's under
# aten::layer_norm).
UNARY_OPS = frozenset(
    f"aten::{n}"
    for n in (
        "copy_",
        "neg",
        "abs",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "sin",
        "cos",
        "tanh",
        "sigmoid",
        "erf",
        "relu",
        "relu_",
        "gelu",
        "gelu_",
        "silu",
        "silu_",
        "hardswish",
        "leaky_relu",
        "elu",
        "pow",
        "exp_",
        "sigmoid_",
        "tanh_",
        "neg_",
    )
)
BINARY_OPS = frozenset(
    f"aten::{n}"
    for n in (
        "add",
        "add_",
        "sub",
        "sub_",
        "rsub",
        "mul",
        "mul_",
        "div",
        "div_",
        "maximum",
        "minimum",
    )
)
REDUCTION_OPS = frozenset(
    f"aten::{n}"
    for n in (
        "sum",
        "mean",
        "amax",
        "amin",
        "max",
        "min",
        "argmax",
        "argmin",
        "prod",
        "logsumexp",
        "var",
        "std",
        "linalg_vector_norm",
        "norm",
    )
)
SOFTMAX_OPS = frozenset({"aten::_softmax", "aten::softmax", "aten::_log_softmax", "aten::log_softmax"})
NORM_OPS = frozenset(
    f"aten::{n}"
    for n in (
        "native_layer_norm",
        "layer_norm",
        "rms_norm",
        "_fused_rms_norm",
        "native_batch_norm",
        "batch_norm",
        "_batch_norm_impl_index",
        "cudnn_batch_norm",
        "miopen_batch_norm",
        "native_group_norm",
        "group_norm",
    )
)
MEMORY_BOUND_OPS = UNARY_OPS | BINARY_OPS | REDUCTION_OPS | SOFTMAX_OPS | NORM_OPS
# Host ops whose ``Concrete Inputs`` (scalar arguments) the loader keeps: convolution geometry, is_causal,
# the reduced dims, softmax's half_to_float, batch norm's training flag.
CONCRETE_OPS = (
    CONV_OPS
    | CONV_BACKWARD_OPS
    | ATTENTION_OPS
    | ATTENTION_INNER_OPS
    | ATTENTION_BACKWARD_OPS
    | REDUCTION_OPS
    | SOFTMAX_OPS
    | NORM_OPS
)
# Host ops whose shapes the loader keeps: the FLOP counter's ops, attention's backends and the memory-bound
# families (the roofline), and the embedding, whose token ids give the tokens per step of a foreign trace
# (analyzer.metrics.workload).
SHAPE_OPS = FLOP_OPS | MEMORY_BOUND_OPS | frozenset({"aten::embedding"})
# Event categories of older format eras, lower-cased, -> today's category
# (docs/metrics.md, "Event categories"). The TensorBoard-plugin era of the
# PyTorch profiler (1.8-1.9, Kineto's early ChromeTraceLogger) wrote
# ``Operator``, ``Runtime``, ``Kernel``, ``Memcpy``, ``Memset``, ``Python``;
# the plugin's own reader (tb_plugin/torch_tb_profiler/profiler/trace.py,
# EventTypeMap) maps them the same way. The loader stores every category in
# today's spelling, so each rule and metric knows one set of names.
CATEGORY_ALIASES = {
    "operator": "cpu_op",
    "runtime": "cuda_runtime",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "python": "python_function",
}
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
ANNOTATION_CATS = frozenset({"user_annotation", "gpu_user_annotation"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver"})
# Categories Kineto writes on a GPU's timeline (pid = device, tid = stream).
# cuda_sync ("Stream Sync", "Event Sync") sits on a stream but is waiting,
# not device work: it gets a stream and kind "other".
GPU_TIMELINE_CATS = DEVICE_CATS | {"gpu_user_annotation", "cuda_sync"}

COLUMNS: dict[str, str] = {
    "rank": "int32",
    "cat": "category",
    "name": "category",
    "kind": "category",
    "pid": "int64",
    "tid": "int64",
    "stream": "int64",
    "start_ns": "int64",
    "end_ns": "int64",
    "correlation": "int64",
    "external_id": "int64",
    "seq_num": "int64",
    "fwd_tid": "int64",
    "input_dims": "object",
    "input_types": "object",
    "concrete_inputs": "object",
    "coll_name": "category",
    "msg_in_nelems": "int64",
    "msg_out_nelems": "int64",
    "msg_dtype": "category",
    "group_size": "int64",
    "pg_name": "category",
    "wait_stream": "int64",
    "record_corr": "int64",
}
INT_DEFAULT = -1


def classify(cat: str, name: str) -> str:
    """Kind of one event from its Kineto category and name.

    ``cat`` may be of any format era (:data:`CATEGORY_ALIASES`).
    Device events: ``comm`` when the name matches nccl/rccl anywhere,
    ``memcpy``/``memset`` by category, else ``compute``. Host events:
    ``cpu_comm`` for collective ops and annotations (c10d::*, gloo:*,
    record_param_comms), ``cpu_op``, ``annotation``, ``runtime``, ``other``.
    """
    cat = canonical_category(cat)
    if cat in DEVICE_CATS:
        if cat == "gpu_memcpy":
            return "memcpy"
        if cat == "gpu_memset":
            return "memset"
        return "comm" if COMM_KERNEL_RE.search(name.lower()) else "compute"
    if CPU_COMM_RE.search(name):
        return "cpu_comm"
    if cat == "cpu_op":
        return "cpu_op"
    if cat in ANNOTATION_CATS:
        return "annotation"
    if cat in RUNTIME_CATS:
        return "runtime"
    return "other"


def canonical_category(cat: str) -> str:
    """A Kineto category in today's spelling: lower-cased, and an older
    era's name (``Memcpy``, ``Operator``, ...) replaced by today's."""
    cat = cat.lower()
    return CATEGORY_ALIASES.get(cat, cat)


def text_id(value: object) -> int:
    """A pid/tid/stream as an integer: numbers as they are, numeric strings
    parsed (``"7"``, ``"0x1f"``), any other text a stable negative id
    ``-2 - crc32(text)`` (never -1, which means "absent")."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value == value else -1
    if value is None:
        return -1
    text = str(value).strip()
    try:
        return int(text, 0)
    except ValueError:
        return -2 - zlib.crc32(text.encode())
