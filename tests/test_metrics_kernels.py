"""Top kernels (device) and host ops (CPU-only traces) with exact totals and shares."""

from __future__ import annotations

import pandas as pd
import pytest

from analyzer.metrics.kernels import top_kernels
from analyzer.ingest.tables import events_from_records

US = 1000


def ev(name: str, start_us: float, dur_us: float, cat: str = "kernel", tid: int = 7) -> dict:
    return {
        "rank": 3,
        "cat": cat,
        "name": name,
        "tid": tid,
        "start_ns": int(start_us * US),
        "end_ns": int((start_us + dur_us) * US),
    }


def test_device_kernels_ranked_with_shares_of_kernel_time() -> None:
    events = events_from_records(
        [
            ev("gemm", 0, 30),
            ev("gemm", 40, 50),
            ev("ncclDevKernel_AllReduce", 0, 60, tid=20),
            ev("Memcpy HtoD (Pageable -> Device)", 100, 20, cat="gpu_memcpy"),
            ev("aten::mm", 0, 500, cat="cpu_op", tid=1),  # host op: not in a device table
        ]
    )
    out = top_kernels(events, pd.DataFrame(columns=["step", "start_ns", "end_ns"]), rank=3)
    assert out["name"].tolist() == ["gemm", "ncclDevKernel_AllReduce", "Memcpy HtoD (Pageable -> Device)"]
    assert out["kind"].tolist() == ["compute", "comm", "memcpy"]
    assert out["count"].tolist() == [2, 1, 1]
    assert out["total_ms"].tolist() == pytest.approx([0.080, 0.060, 0.020])
    assert out["mean_us"].tolist() == pytest.approx([40.0, 60.0, 20.0])
    assert out["max_us"].tolist() == pytest.approx([50.0, 60.0, 20.0])
    assert out["share_pct"].tolist() == pytest.approx([50.0, 37.5, 12.5])
    assert set(out["source"]) == {"device"} and set(out["rank"]) == {3}
    assert top_kernels(events, pd.DataFrame(columns=["step", "start_ns", "end_ns"]), rank=3, limit=1)[
        "name"
    ].tolist() == ["gemm"]


def test_host_ops_on_cpu_trace_share_of_step_time() -> None:
    events = events_from_records(
        [
            ev("ProfilerStep#0", 0, 1000, cat="user_annotation", tid=1),
            ev("aten::linear", 0, 300, cat="cpu_op", tid=1),
            ev("aten::addmm", 10, 280, cat="cpu_op", tid=1),  # nested: inclusive times
            ev("c10d::allreduce_", 400, 10, cat="cpu_op", tid=1),
            ev("gloo:all_reduce", 405, 200, cat="user_annotation", tid=9),
        ]
    )
    steps = pd.DataFrame({"step": [0], "start_ns": [0], "end_ns": [1000 * US]})
    out = top_kernels(events, steps, rank=3)
    assert out["name"].tolist() == ["aten::linear", "aten::addmm", "gloo:all_reduce", "c10d::allreduce_"]
    assert out["share_pct"].tolist() == pytest.approx([30.0, 28.0, 20.0, 1.0])
    assert set(out["source"]) == {"host"}
    assert out.loc[out["name"] == "gloo:all_reduce", "kind"].item() == "cpu_comm"


# ---------------------------------------------------------------------------
# Kernel taxonomy (analyzer/metrics/taxonomy.py): names as they appear in the shared traces
# ---------------------------------------------------------------------------

TAXONOMY_CASES = [
    # cuBLAS / cuBLASLt / CUTLASS / MAGMA / TRT-LLM
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
        "gemm",
    ),
    ("volta_sgemm_128x32_nt", "gemm"),
    ("ampere_sgemm_128x128_tn", "gemm"),
    ("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(Params)", "gemm"),
    (
        "void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false>(cublasSplitKParams<float>)",
        "gemm",
    ),
    ("void magma_sgemmEx_kernel<float, float, float, true, false, 6, 3, 5, 3, 3>(int, int, int)", "gemm"),
    ("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_transOut", "gemm"),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>(...)", "gemm"),
    # rocBLAS / hipBLASLt (Tensile)
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1", "gemm"),
    # cuDNN / MIOpen convolutions: implicit GEMMs are convolutions, not GEMMs
    (
        "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4",
        "convolution",
    ),
    ("sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x64x64", "convolution"),
    ("cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1", "convolution"),
    (
        "void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_align4>(Params)",
        "convolution",
    ),
    ("_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock", "convolution"),
    ("void cudnn::cnn::reduce_wgrad_nchw_helper<float, float>(int, int, int, float const*, float*)", "convolution"),
    ("void fft2d_r2c_32x32<float, false, 1u, false>(float2*, float const*, int)", "convolution"),
    ("MIOpenConvUni", "convolution"),
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt256x128x32_wt32x32x8_ws2x1_wr2x2", "convolution"),
    # attention
    (
        "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4>>(Flash_fwd_params)",
        "attention",
    ),
    ("attn_fwd", "attention"),
    ("fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext", "attention"),
    ("void paged_attention_ll4mi_QKV_mfma16_kernel<__hip_bfloat16, 128, 256>(...)", "attention"),
    ("fmha_fwd_hd128_bf16_batch_b128x128x32", "attention"),
    # normalization
    (
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>(int, float)",
        "normalization",
    ),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(cudnnTensorStruct)", "normalization"),
    ("MIOpenBatchNormFwdTrainSpatial", "normalization"),
    (
        "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb1ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib",
        "normalization",
    ),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>(long, long)", "normalization"),
    # reduction
    (
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float>>>(...)",
        "reduction",
    ),
    (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>(float*, float const*, int)",
        "reduction",
    ),
    ("triton_red_fused__unsafe_view_add_mean_mul_pow_rsqrt_1", "reduction"),
    # elementwise / fusable
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>>(int)",
        "elementwise",
    ),
    ("triton_poi_fused__unsafe_view_mul_silu_2", "elementwise"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, 128, 1>(...)", "elementwise"),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float>(...)", "elementwise"),
    # communication (NCCL, RCCL keeps NCCL's names)
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "communication"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("void (anonymous namespace)::multimem_all_reduce_kernel<float, 2>(...)", "communication"),
    # other
    (
        "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true>(cudnn::ops::nchw2nhwc_params_t<float>)",
        "other",
    ),
    ("void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, int, int>::Policy800>(...)", "other"),
]


@pytest.mark.parametrize(("name", "cls"), TAXONOMY_CASES)
def test_kernel_taxonomy_on_real_kernel_names(name: str, cls: str) -> None:
    from analyzer.metrics.taxonomy import classify_name

    assert classify_name(name) == cls


def test_taxonomy_ignores_case_though_its_patterns_are_searched_without_re_ignorecase() -> None:
    # The patterns are lower case and searched in the lower-cased name (taxonomy._PATTERNS says why):
    # a name in any case must still classify, and the precision and collective regexes likewise.
    from analyzer.metrics.taxonomy import classify_name, collective_kind_of, is_compiled, kernel_precision

    for name, cls in TAXONOMY_CASES:
        assert classify_name(name.upper()) == cls, name
        assert classify_name(name.swapcase()) == cls, name
    assert kernel_precision("AMPERE_TF32_S1688GEMM_128x128") == "tf32"
    assert kernel_precision("void cutlass::Kernel<CUTLASS_80_TENSOROP_S1688GEMM_128x128_32x3_nn_align4>") == "tf32"
    assert kernel_precision("sm90_xmma_gemm_E4M3E4M3_f32") == "fp8"
    assert collective_kind_of("NCCLDEVKERNEL_ALLREDUCE_SUM_F32") == "all_reduce"
    assert collective_kind_of("nccl:Reduce_Scatter") == "reduce_scatter"
    assert is_compiled("Triton_poi_fused_add_0")


def test_memcpy_memset_and_comm_come_from_the_kind_and_top_kernels_carry_the_class() -> None:
    from analyzer.metrics.taxonomy import kernel_class

    events = events_from_records(
        [
            {"rank": 0, "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "start_ns": 0, "end_ns": 10},
            {"rank": 0, "cat": "gpu_memset", "name": "Memset (Device)", "start_ns": 10, "end_ns": 20},
            {
                "rank": 0,
                "cat": "kernel",
                "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
                "start_ns": 20,
                "end_ns": 90,
            },
            {
                "rank": 0,
                "cat": "kernel",
                "name": "cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1",
                "start_ns": 90,
                "end_ns": 200,
            },
            {"rank": 0, "cat": "cpu_op", "name": "aten::conv2d", "start_ns": 0, "end_ns": 5},
        ]
    )
    assert list(kernel_class(events)) == ["memcpy", "memset", "communication", "convolution", None]
    table = top_kernels(events, events.iloc[:0], 0)
    assert dict(zip(table["name"], table["cls"]))["cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1"] == "convolution"


def test_collective_kind_from_host_annotation_before_kernel_name() -> None:
    """NCCL runs all_to_all as SendRecv kernels: the host range names the collective."""
    from analyzer.metrics.taxonomy import collective_kinds

    def host(name, s, e, **kw):
        return {
            "rank": 0,
            "cat": "user_annotation" if ":" in name else "cpu_op",
            "name": name,
            "pid": 1,
            "tid": 1,
            "start_ns": s,
            "end_ns": e,
            **kw,
        }

    events = events_from_records(
        [
            host("nccl:all_to_all", 0, 100),
            {
                "rank": 0,
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "start_ns": 10,
                "end_ns": 12,
                "correlation": 1,
            },
            host("record_param_comms", 200, 300, coll_name="allreduce"),
            {
                "rank": 0,
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "start_ns": 210,
                "end_ns": 212,
                "correlation": 2,
            },
            {
                "rank": 0,
                "cat": "kernel",
                "name": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
                "pid": 0,
                "tid": 20,
                "start_ns": 50,
                "end_ns": 150,
                "correlation": 1,
            },
            {
                "rank": 0,
                "cat": "kernel",
                "name": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
                "pid": 0,
                "tid": 20,
                "start_ns": 250,
                "end_ns": 350,
                "correlation": 2,
            },
            # No launch in the trace: the kernel name is all there is.
            {
                "rank": 0,
                "cat": "kernel",
                "name": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
                "pid": 0,
                "tid": 20,
                "start_ns": 400,
                "end_ns": 450,
                "correlation": 3,
            },
        ]
    )
    assert collective_kinds(events).tolist() == ["all_to_all", "all_reduce", "send_recv"]


def test_kernel_totals_use_the_analysis_window_of_overlap_and_idle() -> None:
    """Two steps: a kernel launched after the last step ends (profiler flushing) is not in the totals."""

    def ev(cat, name, s, e, corr=-1, tid=1):
        return {
            "rank": 0,
            "cat": cat,
            "name": name,
            "pid": 0 if cat == "kernel" else 1,
            "tid": tid,
            "start_ns": s,
            "end_ns": e,
            "correlation": corr,
        }

    events = events_from_records(
        [
            ev("user_annotation", "ProfilerStep#1", 0, 100),
            ev("user_annotation", "ProfilerStep#2", 100, 200),
            ev("cuda_runtime", "cudaLaunchKernel", 10, 12, 1),
            ev("kernel", "ncclDevKernel_AllReduce", 20, 60, 1, tid=20),
            ev("cuda_runtime", "cudaLaunchKernel", 110, 112, 2),
            ev("kernel", "ncclDevKernel_AllReduce", 120, 160, 2, tid=20),
            ev("cuda_runtime", "cudaLaunchKernel", 300, 302, 3),
            ev("kernel", "ncclDevKernel_AllReduce", 310, 330, 3, tid=20),
        ]
    )
    steps = pd.DataFrame({"step": [1, 2], "start_ns": [0, 100], "end_ns": [100, 200]})
    table = top_kernels(events, steps, 0)
    assert table["count"].tolist() == [2]  # 3 with the kernel launched after the last step
    assert table["total_ms"].tolist() == [80 / 1e6]


def test_step_windows_past_the_events_or_overlapping_are_clipped_or_dropped_with_a_warning() -> None:
    from analyzer.metrics.windows import check_windows

    s = 1_000_000_000  # ns
    events = events_from_records(
        [
            {"rank": 0, "cat": "cpu_op", "name": "aten::mm", "start_ns": 0, "end_ns": 300_000_000},
            {"rank": 0, "cat": "kernel", "name": "sgemm", "start_ns": 10, "end_ns": 330_000_000},
            {
                "rank": 0,
                "cat": "user_annotation",
                "name": "ProfilerStep#3",
                "start_ns": 0,
                "end_ns": 13 * s + 330_000_000,
            },
        ]
    )
    steps = pd.DataFrame(
        {
            "step": [1, 2, 3, 4],
            "start_ns": [0, 100_000_000, 200_000_000, 20 * s],
            "end_ns": [120_000_000, 200_000_000, 13 * s + 330_000_000, 21 * s],
        }
    )
    checked = check_windows(events, steps, rank=0)
    assert checked.steps["step"].tolist() == [1, 2, 3]  # step 4 lies wholly after the events: dropped
    assert checked.steps["start_ns"].tolist() == [0, 120_000_000, 200_000_000]  # step 2 starts where step 1 ends
    assert checked.steps["end_ns"].tolist() == [120_000_000, 200_000_000, 330_000_000]  # step 3: 13.13 s -> 130 ms
    assert checked.steps["flagged"].tolist() == [False, True, True]
    assert len(checked.warnings) == 3
    assert "ProfilerStep#3 clipped" in checked.warnings[1] and "13.000 s after the last event" in checked.warnings[1]
    assert "ProfilerStep#4 dropped" in checked.warnings[2]
    clean = check_windows(events, steps.iloc[:1], rank=0)
    assert clean.warnings == [] and clean.n_flagged == 0


def test_top_kernels_name_the_collective_kind_the_host_called() -> None:
    events = events_from_records(
        [
            {
                "rank": 0,
                "cat": "user_annotation",
                "name": "nccl:all_to_all",
                "pid": 1,
                "tid": 1,
                "start_ns": 0,
                "end_ns": 100,
            },
            {
                "rank": 0,
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "start_ns": 10,
                "end_ns": 12,
                "correlation": 1,
            },
            {
                "rank": 0,
                "cat": "kernel",
                "name": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
                "pid": 0,
                "tid": 20,
                "start_ns": 50,
                "end_ns": 150,
                "correlation": 1,
            },
            {
                "rank": 0,
                "cat": "kernel",
                "name": "volta_sgemm_128x64_nn",
                "pid": 0,
                "tid": 7,
                "start_ns": 50,
                "end_ns": 90,
            },
        ]
    )
    table = top_kernels(events, events.iloc[:0], 0)
    kinds = dict(zip(table["name"], table["coll_kind"]))
    assert kinds["ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)"] == "all_to_all"  # the name says send_recv
    assert kinds["volta_sgemm_128x64_nn"] is None


@pytest.mark.parametrize(
    "name, precision",
    [
        # fp32 operands on the TF32 MMA shape (trace_diff/control's CUTLASS SGEMMs), and names that say tf32
        (
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)",
            "tf32",
        ),
        ("ampere_tf32_s1688gemm_tf32_128x128_16x4_nn", "tf32"),
        ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4", "tf32"),
        (
            "void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_align4>(Params)",
            "tf32",
        ),
        # 16-bit operands with fp32 accumulation ("s"): bf16/fp16, not TF32 (the H100 samples' timesformer and
        # bert-small GEMMs; a Turing fp16 GEMM)
        (
            "void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn_align1>(cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn_align1::Params)",
            None,
        ),
        (
            "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_256x128_64x3_tn_align2>(cutlass_80_tensorop_bf16_s16816gemm_bf16_256x128_64x3_tn_align2::Params)",
            None,
        ),
        (
            "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_align8>(Params)",
            None,
        ),
        ("turing_fp16_s1688gemm_fp16_256x128_ldg8_f2f_nn", None),
        ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", None),
        ("ampere_sgemm_128x64_nn", None),
        ("sm90_xmma_gemm_e4m3e4m3_f32_f32_tn_n_tilesize128x128x64", "fp8"),
    ],
)
def test_kernel_precision_tells_tf32_from_16_bit_operands(name: str, precision: str | None) -> None:
    from analyzer.metrics.taxonomy import kernel_precision

    assert kernel_precision(name) == precision
