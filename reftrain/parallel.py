"""Process groups and the transformations applied to a plain model: AC, compile, DDP, FSDP2.

Order (as in torchtitan): activation checkpointing wraps each block, then
each block is compiled in place, then data parallelism wraps the whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from reftrain.config import Config
from reftrain.errors import ReftrainError
from reftrain.model import Transformer


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits: rank, world, device and backend."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str
    under_launcher: bool  # started by torchrun / torch.distributed.run (else a lone process)


def init_distributed(cfg: Config) -> DistEnv:
    """Initialize the default process group: NCCL on CUDA, gloo on CPU (or `parallel.backend`).

    Under torchrun the rendezvous comes from the environment (RANK,
    WORLD_SIZE, MASTER_ADDR, ...). A process started without a launcher gets
    a one-rank group on an in-memory store, so the same code path runs.
    """
    under_launcher = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    want = cfg.train.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise ReftrainError("train.device=cuda but torch sees no CUDA device (CPU build or no driver)")
        if local_rank >= torch.cuda.device_count():
            raise ReftrainError(
                f"local rank {local_rank} has no GPU: this node has {torch.cuda.device_count()}; "
                "use at most that many processes per node"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = cfg.parallel.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ReftrainError("parallel.backend=nccl needs CUDA devices; use gloo on CPU")
    if cfg.train.dtype == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ReftrainError(f"train.dtype=bf16 but {torch.cuda.get_device_name(device)} has no bf16 support")
    if not dist.is_initialized():
        if under_launcher:
            # The timeout bounds the rendezvous (a hang in gloo's connect becomes an
            # error, and torchelastic restarts the attempt) and every collective.
            timeout = timedelta(seconds=cfg.parallel.timeout_s)
            device_id = device if device.type == "cuda" else None
            store = _attempt_store(rank, world_size, timeout)
            if store is None:
                dist.init_process_group(backend, device_id=device_id, timeout=timeout)
            else:
                dist.init_process_group(
                    backend, store=store, rank=rank, world_size=world_size, device_id=device_id, timeout=timeout
                )
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return DistEnv(rank, local_rank, world_size, device, backend, under_launcher)


def _attempt_store(rank: int, world_size: int, timeout: timedelta) -> dist.Store | None:
    """Under torchelastic's shared rendezvous store, a store whose keys belong to this attempt.

    torch >= 2.4's dynamic rendezvous hands its own TCPStore to the workers
    (TORCHELASTIC_USE_AGENT_STORE=True) and keeps it across restarts, and
    init_process_group's keys carry no attempt: a restarted attempt's gloo
    rendezvous can read the dead attempt's addresses ("Connection refused") or
    barrier counts (a hang). A PrefixStore keyed on TORCHELASTIC_RESTART_COUNT
    starts each attempt on fresh keys. None elsewhere (env:// as usual).
    `reftrain --nproc` disables the sharing instead (cli._launch), so there a
    fresh store serves each attempt; this covers a plain `torchrun --max-restarts`.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    tcp = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=timeout
    )
    return dist.PrefixStore(f"reftrain/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", tcp)


def shutdown() -> None:
    """Destroy the default process group if one is up."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def apply_activation_checkpointing(model: Transformer) -> None:
    """Wrap every block so its activations are recomputed in backward (non-reentrant)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_wrapper(block)


def apply_compile(model: Transformer, backend: str = "inductor") -> None:
    """torch.compile each block in place with ``backend`` (keeps module types, so DDP/FSDP2 wrap as usual)."""
    for block in model.blocks:
        block.compile(backend=backend)


def apply_ddp(model: nn.Module, cfg: Config, env: DistEnv) -> nn.Module:
    """DistributedDataParallel with the configured buckets and graph options."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    p = cfg.parallel
    return DDP(
        model,
        device_ids=[env.device.index] if env.device.type == "cuda" else None,
        bucket_cap_mb=p.bucket_cap_mb,
        gradient_as_bucket_view=p.gradient_as_bucket_view,
        static_graph=p.static_graph,
    )


def apply_fsdp(model: Transformer, cfg: Config, env: DistEnv) -> nn.Module:
    """FSDP2: fully_shard each block, then the root (embeddings, final norm, head).

    bf16 runs use FSDP2's MixedPrecisionPolicy (bf16 parameters for compute,
    fp32 gradient reduction) instead of autocast, as torchtitan does.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(env.device.type, (env.world_size,))
    if cfg.train.dtype == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    reshard = cfg.parallel.reshard_after_forward
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    return model


def allreduce_gradients(params: list[nn.Parameter], bucket_cap_mb: float, world_size: int) -> None:
    """Average gradients across ranks in buckets after backward (no overlap with compute).

    The explicit counterpart of DDP's overlapped bucket all-reduce, for
    `parallel.overlap_grad_sync=false`: buckets of up to bucket_cap_mb, in
    reverse parameter order like DDP's, each flattened, scaled by 1/world
    and summed (DDP's default numerics), then copied back.
    """
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    cap = bucket_cap_mb * 2**20
    grads = [p.grad for p in reversed(params) if p.grad is not None]
    bucket: list[torch.Tensor] = []
    size = 0

    def flush() -> None:
        if not bucket:
            return
        flat = _flatten_dense_tensors(bucket)
        flat.mul_(1.0 / world_size)
        dist.all_reduce(flat)
        for g, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            g.copy_(synced)
        bucket.clear()

    for g in grads:
        if bucket and (size + g.numel() * g.element_size() > cap or g.dtype != bucket[0].dtype):
            flush()
            size = 0
        bucket.append(g)
        size += g.numel() * g.element_size()
    flush()
