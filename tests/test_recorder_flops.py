"""recorder.flops: one training step's FLOPs by phase (model, recompute, optimizer), against hand counts.

Every expected value below is counted by hand from the layer shapes (2 FLOPs
per multiply-add, as torch's FlopCounterMode counts), independently of the
code under test; the reftrain test compares with PaLM's formula
(reftrain/flops.py), a second independent path.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop  # noqa: E402

from recorder.flops import StepFlopCounter, StepFlops  # noqa: E402

B, D, H = 4, 8, 16
LINEAR = 2 * B * D * H  # one D x H linear's forward over B rows


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Linear(D, H, bias=False), torch.nn.Linear(H, D, bias=False)


def _count(fn) -> StepFlops:
    with StepFlopCounter() as counter:
        fn()
    return counter.result(tokens=B)


def test_plain_step_counts_forward_and_backward():
    l1, l2 = _mlp()
    x = torch.randn(B, D)  # input without grad: l1 has no input gradient
    result = _count(lambda: l2(torch.relu(l1(x))).sum().backward())
    # forward 2 linears; backward: both weight gradients, l2's input gradient
    assert result.model == 2 * LINEAR + 2 * LINEAR + LINEAR
    assert (result.recompute, result.optimizer) == (0, 0)
    assert result.by_op == {"aten.mm": 5 * LINEAR}
    assert result.per_token == 5 * LINEAR / B
    saved = result.to_manifest()
    assert (saved.source, saved.per_token, saved.per_token_hardware) == ("measured", 5 * LINEAR / B, 5 * LINEAR / B)
    assert saved.measured is not None and saved.measured.to_json()["model"] == 5 * LINEAR
    assert saved.source_text.startswith("measured: torch.utils.flop_counter.FlopCounterMode")


@pytest.mark.parametrize(
    "reentrant, early_stop, recomputed",
    [
        # the reentrant checkpoint runs the whole region's forward again
        (True, True, 2 * LINEAR),
        # the non-reentrant one stops once every saved tensor is back: l2's
        # output is saved by nothing in the region, so l2 is not run again
        (False, True, LINEAR),
        (False, False, 2 * LINEAR),
    ],
)
def test_checkpoint_recompute_is_hardware_not_model(reentrant, early_stop, recomputed):
    l1, l2 = _mlp()
    x = torch.randn(B, D, requires_grad=True)  # the reentrant checkpoint needs an input with grad

    def step():
        with set_checkpoint_early_stop(early_stop):
            y = checkpoint(lambda t: l2(torch.relu(l1(t))), x, use_reentrant=reentrant)
            y.sum().backward()

    result = _count(step)
    assert result.model == 2 * LINEAR + 4 * LINEAR  # as written: forward, then dW and dX of both
    assert result.recompute == recomputed
    assert result.hardware == result.model + recomputed


def test_optimizer_flops_are_apart():
    class Orthogonalising(torch.optim.Optimizer):
        """An update with matmuls (as Muon or Shampoo do): p -= lr * g g^T g."""

        def __init__(self, params):
            super().__init__(params, {"lr": 0.1})

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    g = p.grad
                    p -= group["lr"] * (g @ g.T @ g)

    l1, l2 = _mlp()
    opt = Orthogonalising(list(l1.parameters()) + list(l2.parameters()))
    x = torch.randn(B, D)

    def step():
        l2(torch.relu(l1(x))).sum().backward()
        opt.step()

    result = _count(step)
    assert result.model == 5 * LINEAR
    # l1.weight is H x D: g g^T is 2*H*D*H, times g another 2*H*H*D; l2.weight (D x H) likewise with D, H swapped
    assert result.optimizer == (2 * H * D * H + 2 * H * H * D) + (2 * D * H * D + 2 * D * D * H)
    assert result.hardware == result.model


def test_a_closure_run_by_the_optimizer_is_the_models():
    """Lightning runs forward and backward in a closure that Optimizer.step calls."""
    l1, l2 = _mlp()
    opt = torch.optim.SGD(list(l1.parameters()) + list(l2.parameters()), lr=0.1)
    x = torch.randn(B, D)

    def closure():
        opt.zero_grad()
        loss = l2(torch.relu(l1(x))).sum()
        loss.backward()
        return loss

    result = _count(lambda: opt.step(closure))
    assert (result.model, result.optimizer) == (5 * LINEAR, 0)
    result = _count(lambda: opt.step(closure=closure))
    assert (result.model, result.optimizer) == (5 * LINEAR, 0)


def _attention_step(q, k, v):
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()


@pytest.mark.parametrize("backend", [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])
def test_attention_model_flops_do_not_depend_on_the_backend(backend):
    b, h, seq, e = 2, 4, 32, 16
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, seq, e, requires_grad=True) for _ in range(3))
    with sdpa_kernel(backend):
        result = _count(_attention_step(q, k, v))
    forward = 2 * (2 * b * h * seq * seq * e)  # QK^T and PV, causal mask not discounted
    assert result.model == 3 * forward  # backward = 2 x forward: dP, dV, dQ, dK (PaLM's 12LHQT)
    if backend == SDPBackend.FLASH_ATTENTION:  # on CPU: _scaled_dot_product_flash_attention_for_cpu
        assert result.recompute == forward // 2  # the fused backward computes QK^T again
        assert result.added_formulas == [
            "aten._scaled_dot_product_flash_attention_for_cpu",
            "aten._scaled_dot_product_flash_attention_for_cpu_backward",
        ]
    else:
        assert result.recompute == 0
        assert result.added_formulas == []


def test_cnn():
    torch.manual_seed(0)
    conv1, conv2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 4, 3, padding=1)
    x = torch.randn(2, 3, 16, 16)
    result = _count(lambda: conv2(torch.relu(conv1(x))).sum().backward())
    fwd1 = 2 * 2 * 8 * 16 * 16 * 3 * 3 * 3  # 2 * batch * C_out * H_out * W_out * C_in * k * k
    fwd2 = 2 * 2 * 4 * 16 * 16 * 8 * 3 * 3
    # conv1: forward + weight gradient (its input needs none); conv2: forward + weight and input gradients
    assert result.model == 2 * fwd1 + 3 * fwd2


def test_mixture_of_experts_counts_the_routed_tokens():
    """Top-1 routing with a null expert (tokens sent there skip the layer): the FLOPs depend on the data."""
    n_experts, tokens, d, f = 4, 64, 8, 32
    torch.manual_seed(0)
    router = torch.nn.Linear(d, n_experts, bias=False)
    up = torch.nn.ModuleList(torch.nn.Linear(d, f, bias=False) for _ in range(n_experts - 1))
    down = torch.nn.ModuleList(torch.nn.Linear(f, d, bias=False) for _ in range(n_experts - 1))
    x = torch.randn(tokens, d)
    choice = router(x).argmax(-1)

    def step():
        gate, expert = F.softmax(router(x), -1).max(-1)
        out = torch.zeros_like(x)
        for e in range(n_experts - 1):
            rows = (expert == e).nonzero().squeeze(1)
            out[rows] = gate[rows, None] * down[e](F.gelu(up[e](x[rows])))
        out.sum().backward()

    result = _count(step)
    routed = int((choice != n_experts - 1).sum())
    assert 0 < routed < tokens
    # router: forward + weight gradient; each routed token: up and down forward, both weight
    # gradients and down's input gradient (5 d f multiply-adds)
    assert result.model == 2 * (2 * tokens * d * n_experts) + routed * 5 * 2 * d * f


@pytest.mark.parametrize("activation_checkpointing", [False, True])
@pytest.mark.parametrize(
    "model_cfg",
    [
        {"preset": "tiny"},
        {"preset": "small"},
        {"preset": "tiny", "mlp": "swiglu", "tie_embeddings": False},
    ],
)
def test_reftrain_models_agree_with_the_palm_formula(model_cfg, activation_checkpointing):
    """Measured model and hardware FLOPs per token within 1 % of reftrain's formulas (reftrain/flops.py).

    They differ exactly by the LayerNorm gains the formula keeps in N (docs/mfu.md): 0.05-0.3 % here.
    Hardware: the attention backward's recompute of QK^T, and under activation checkpointing the
    blocks' forward again up to their last saved activation (not the MLP's output projection).
    """
    from reftrain import config, flops, parallel
    from reftrain.model import Transformer, block_parameter_count, parameter_counts

    cfg = config.resolve(config.from_dict({"model": model_cfg}), world_size=1).model
    torch.manual_seed(0)
    model = Transformer(cfg)
    formula = flops.flops_per_token(
        parameter_counts(model)["non_embedding"],
        block_parameter_count(model),
        cfg.n_layers,
        cfg.n_heads,
        cfg.d_model // cfg.n_heads,
        cfg.seq_len,
        cfg.d_ff,
        activation_checkpointing,
    )
    if activation_checkpointing:
        parallel.apply_activation_checkpointing(model)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    result = _count(lambda: model(idx, idx).backward())
    tokens = idx.numel()
    measured = result.model / tokens
    assert measured == pytest.approx(formula.model, rel=0.01)
    # what the formula counts beyond the matmuls: 6 FLOPs per token per LayerNorm gain
    norm_gains = (2 * cfg.n_layers + 1) * cfg.d_model
    assert measured == formula.model - 6 * norm_gains
    measured_hw = result.hardware / tokens
    assert measured_hw == pytest.approx(formula.hardware, rel=0.01)
    # and 2 per recomputed block gain (two LayerNorms per block) under activation checkpointing
    recomputed_gains = 2 * cfg.n_layers * cfg.d_model if activation_checkpointing else 0
    assert measured_hw == formula.hardware - 6 * norm_gains - 2 * recomputed_gains
