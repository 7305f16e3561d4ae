"""The kernel taxonomy: one class per device event, from its kind and name.

The one place that says what a kernel is; every metric and suggestion rule
that needs "GEMM time", "fusable time" or "communication" asks here
(docs/metrics.md, "Kernel taxonomy"). Classes, tried in this order (first
match wins, so a cuDNN implicit-GEMM convolution is a convolution, not a
GEMM, and a FlashAttention kernel built on CUTLASS is attention):

=================  ===========================================================
class              what it is
=================  ===========================================================
memcpy, memset     the event's kind (Kineto category ``gpu_memcpy`` /
                   ``gpu_memset``, old era ``Memcpy`` / ``Memset``)
communication      NCCL/RCCL kernels (``ncclKernel_*``, ``ncclDevKernel_*``;
                   RCCL keeps NCCL's names), and torch/vLLM symmetric-memory
                   all-reduce kernels (``multimem_all_reduce``,
                   ``one_shot_all_reduce``, ``cross_device_reduce``)
attention          FlashAttention (``flash_fwd``, ``flash_bwd``), cuDNN/TRT
                   fused MHA (``fmha``, ``cudnn_generated_fort_native_sdpa``),
                   CK / aiter (``fmha_fwd``, ``mha_``), Triton ``attn_fwd``,
                   paged attention (vLLM/SGLang), xformers ``efficient_attention``
convolution        cuDNN (``*_fprop_*``, ``*_dgrad_*``, ``*_wgrad_*``,
                   ``implicit_gemm``, ``scudnn``, ``winograd``, ``fft2d_*``,
                   ``cutlass_cudnn*``, ``ImplicitGemmConvolution``), MIOpen
                   (``MIOpenConv*``, ``miopenSp3AsmConv``, ``igemm_*``,
                   ``naive_conv``), Triton/aten ``conv``
GEMM               cuBLAS/cuBLASLt (``*gemm*``, ``gemv*``, ``nvjet_*``,
                   ``splitKreduce``, ``cublasLt::``), CUTLASS
                   (``cutlass::Kernel``), MAGMA, TRT-LLM ``bmm_*``, rocBLAS /
                   hipBLASLt Tensile (``Cijk_*``), CK (``device_gemm``,
                   ``ck::kernel_gemm``), Inductor templates (``triton_tem_*mm``)
normalization      layer/RMS/batch/group norm: aten (``layer_norm``,
                   ``batch_norm``, ``GammaBeta``, ``RowwiseMoments``), apex
                   (``cuApplyLayerNorm``, ``cuComputeGradGammaBeta``), cuDNN
                   (``bn_fw``, ``bn_bw``), MIOpen (``MIOpenBatchNorm*``),
                   ``rms_norm``/``rmsnorm``
reduction          aten ``reduce_kernel``, softmax, CUB reductions and
                   scans, Inductor ``triton_red_*`` / ``triton_per_*``
elementwise        aten TensorIterator kernels (``elementwise_kernel``,
                   ``vectorized_elementwise``), cat/copy, dropout, random,
                   activations, optimizer ``multi_tensor_apply``, Inductor
                   ``triton_poi_*``: the kernels a compiler can fuse
other              everything else (sorts, embedding lookups, indexing,
                   layout transforms such as cuDNN ``nchwToNhwc``)
=================  ===========================================================

``FLOP_CLASSES`` (GEMM, attention, convolution) are the kernels whose FLOPs
MFU counts and whose time FLOP coverage is measured against.
``FUSABLE_CLASSES`` (elementwise, reduction, normalization) are what
``torch.compile`` can fuse; a kernel Inductor already generated
(``triton_*``) is fusable-class but :func:`is_compiled`.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pandas as pd

from analyzer.metrics.memo import per_table
from analyzer.metrics.text import is_in, text_map

CLASSES = (
    "gemm",
    "convolution",
    "attention",
    "elementwise",
    "reduction",
    "normalization",
    "communication",
    "memcpy",
    "memset",
    "other",
)
FLOP_CLASSES = frozenset({"gemm", "attention", "convolution"})
FUSABLE_CLASSES = frozenset({"elementwise", "reduction", "normalization"})

# Name patterns, tried in this order, searched in the lower-cased name: written in lower case and
# compiled without re.I, which made each search about 7x slower on kernel names of a few hundred
# characters (174 names of trace_diff/control: 25 ms against 3.5 ms, all of it on a cold report's path).
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "communication",
        re.compile(r"nccl|rccl|multimem_all_reduce|one_shot_all_reduce|two_shot_all_reduce|cross_device_reduce"),
    ),
    (
        "attention",
        re.compile(
            r"flash_?(fwd|bwd|attn)|fmha|attn_(fwd|bwd)|_attention|attention_|paged_attention|native_sdpa|sdpa_|mha_|"
            r"efficient_attention|flashinfer.*(prefill|decode)(?!.*indices)"
        ),
    ),
    (
        "convolution",
        re.compile(
            r"fprop|dgrad|wgrad|implicit_?gemm|convolution|conv2d|conv3d|conv1d|_conv_|scudnn|winograd|fft2d_|fft3d_|"
            r"cutlass_?_?\w*cudnn|miopen\w*conv|sp3asmconv|igemm_(fwd|bwd|wrw)|naive_conv|depthwise"
        ),
    ),
    (
        "normalization",
        re.compile(
            r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|bn_fw|bn_bw|gammabeta|rowwisemoments|"
            r"computeinternalgradients|computefusedparams|computebackwardfusedparams|cuapplylayernorm|"
            r"cucomputepartgradgammabeta|cucomputegradgammabeta|miopenbatchnorm"
        ),
    ),
    (
        "gemm",
        re.compile(
            r"gemm|gemv|nvjet|cublas|cutlass|xmma|cijk_|wgmma|splitkreduce|magma_|^bmm_|triton_tem_\w*mm|"
            r"device_gemm|kernel_gemm|hipblaslt|rocblas"
        ),
    ),
    (
        "reduction",
        re.compile(
            r"reduce_kernel|softmax|devicereduce|devicesegmentedreduce|devicescan|triton_red_|triton_per_|"
            r"reduce_row|reduce_col|norm_kernel|argmax|argmin|_sum_|cumsum"
        ),
    ),
    (
        "elementwise",
        re.compile(
            r"elementwise|triton_poi_|multi_tensor_apply|catarraybatchedcopy|copy_kernel|fill_kernel|dropout|"
            r"distribution_|silu|gelu|relu|act_and_mul|rotary|upsample|pool"
        ),
    ),
)
# Inductor-generated kernels: already fused by torch.compile.
_COMPILED_RE = re.compile(r"^triton_")
# TF32 tensor-core GEMMs/convolutions: cuBLAS/CUTLASS/cuDNN names that say tf32, or an sm80+ tensor-op SGEMM
# of the TF32 MMA shape m16n8k8 (s1688) with fp32 operands. The same s1688 names carry 16-bit operands too
# (cutlass_75_tensorop_bf16_s1688gemm_bf16_..., turing_fp16_s1688gemm_fp16_...: fp32 accumulation, "s"), and
# s16816 is the MMA shape of 16-bit operands only (cutlass_80_tensorop_bf16_s16816gemm_bf16_...): neither is TF32.
TF32_KERNEL_RE = re.compile(r"tf32")
TF32_SHAPE_RE = re.compile(r"tensorop_s1688|s1688gemm")
HALF_OPERANDS_RE = re.compile(r"bf16|fp16|f16|half")
# FP8 GEMMs and attention: e4m3/e5m2 in cuBLASLt/CUTLASS/TRT-LLM names, hipBLASLt "F8" data types.
FP8_KERNEL_RE = re.compile(r"e4m3|e5m2|fp8|f8f8|_f8_|float8")


@functools.lru_cache(maxsize=1 << 16)
def classify_name(name: str) -> str:
    """Class of a compute or communication kernel by name alone (never memcpy/memset).

    Cached: each name runs up to seven regex searches, a trace has a few hundred
    distinct kernel names, and several metrics classify the same trace.
    """
    lowered = name.lower()
    for cls, pattern in _PATTERNS:
        if pattern.search(lowered):
            return cls
    return "other"


def kernel_class(events: pd.DataFrame) -> np.ndarray:
    """Class per row (object array) for device rows; None for host rows.

    memcpy/memset come from the kind; communication from the kind (the
    loader's nccl/rccl match) or the name; the rest from the name.
    """
    kind = events["kind"]
    out = np.full(len(events), None, dtype=object)
    # Masks from the kind's codes (text.is_in): comparing the object strings row by row cost 4 ms a rank.
    device = is_in(kind, ("compute", "comm", "memcpy", "memset"))
    # Only device rows' names are classified: host op names are as many again and never used.
    out[device] = text_map(events["name"][device], classify_name, "other", sparse=True)
    for name, cls in (("comm", "communication"), ("memcpy", "memcpy"), ("memset", "memset")):
        out[is_in(kind, (name,))] = cls
    return out


@per_table  # the attribution, the top kernels and the FLOP counter of a rank each ask (analyzer.metrics.memo)
def row_classes(events: pd.DataFrame) -> np.ndarray:
    """:func:`kernel_class` of every row of a rank's table, once per table; read-only (index it)."""
    out = kernel_class(events)
    out.setflags(write=False)
    return out


def is_compiled(name: str) -> bool:
    """The kernel was generated by torch.compile (Inductor's Triton kernels)."""
    return bool(_COMPILED_RE.search(name.lower()))


def kernel_precision(name: str) -> str | None:
    """``fp8`` or ``tf32`` when a GEMM/conv/attention kernel's name says so; else None (dtype from the op)."""
    lowered = name.lower()
    if FP8_KERNEL_RE.search(lowered):
        return "fp8"
    if TF32_KERNEL_RE.search(lowered) or (TF32_SHAPE_RE.search(lowered) and not HALF_OPERANDS_RE.search(lowered)):
        return "tf32"
    return None


# Collective kinds: host annotations (nccl:all_to_all), record_param_comms
# "Collective name", c10d ops and kernel names all map through these.
_COLLECTIVE_PATTERNS = (
    (re.compile(r"all_?reduce"), "all_reduce"),
    (re.compile(r"reduce_?scatter"), "reduce_scatter"),
    (re.compile(r"all_?gather"), "all_gather"),
    (re.compile(r"all_?to_?all"), "all_to_all"),
    (re.compile(r"broadcast"), "broadcast"),
    (re.compile(r"barrier"), "barrier"),
    (re.compile(r"send_?recv"), "send_recv"),
    (re.compile(r"\breduce|_reduce|reduce_"), "reduce"),
    (re.compile(r"send"), "send"),
    (re.compile(r"recv"), "recv"),
)


def collective_kind_of(name: str) -> str:
    """all_reduce, all_to_all, ... from a collective name, host annotation, c10d op or kernel name; else unknown."""
    lowered = name.lower()  # the patterns are lower case (see _PATTERNS)
    for pattern, kind in _COLLECTIVE_PATTERNS:
        if pattern.search(lowered):
            return kind
    return "unknown"


@per_table  # the collective table, top kernels and straggler arrivals all ask (analyzer.metrics.memo)
def collective_kinds(events: pd.DataFrame) -> pd.Series:
    """Collective kind per communication kernel (index: its row label).

    Host side first: the kernel's own ``Collective name`` (newer PyTorch),
    else that of the innermost host collective op around its launch
    (``record_param_comms`` with ``Collective name``, or the ``nccl:*`` /
    ``gloo:*`` annotation; found by correlation id, :mod:`analyzer.metrics.launch`),
    else the kernel's name. Kernel names can mislead: NCCL runs all-to-all
    as grouped ``SendRecv`` kernels (``ncclKernel_SendRecv_*``), so the name
    says ``send_recv`` where the job called ``all_to_all``.
    """
    from analyzer.metrics.launch import launching_op

    comm = events.loc[(events["kind"] == "comm").to_numpy()]
    if comm.empty:
        return pd.Series([], dtype=object)
    own = pd.Series(text_map(comm["coll_name"], collective_kind_of), index=comm.index)
    host = events.loc[
        (events["kind"] == "cpu_comm").to_numpy(), ["name", "coll_name", "pid", "tid", "start_ns", "end_ns"]
    ]
    host_kind = (
        np.where(
            pd.isna(text_map(host["coll_name"], collective_kind_of)),
            text_map(host["name"], collective_kind_of),
            text_map(host["coll_name"], collective_kind_of),
        )
        if not host.empty
        else np.empty(0, dtype=object)
    )
    # Host ops whose kind is unknown (a bare record_param_comms) cannot name the collective.
    named = host_kind != "unknown"
    host, host_kind = host.loc[named], host_kind[named]
    pos = launching_op(events, comm.index, host.reset_index(drop=True))
    from_host = np.where(pos >= 0, host_kind[np.clip(pos, 0, None)] if len(host_kind) else None, None)
    by_name = text_map(comm["name"], collective_kind_of)
    kind = np.where(
        pd.notna(own.to_numpy()) & (own.to_numpy() != "unknown"),
        own.to_numpy(),
        np.where(pd.notna(np.asarray(from_host, dtype=object)), from_host, by_name),
    )
    return pd.Series(kind, index=comm.index, dtype=object)
