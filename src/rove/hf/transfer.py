"""A RoPE model converted to RoVE by fitting, before any training (``conversion="transfer"``).

Switching a pretrained RoPE model to RoVE changes only its value path: token j now reaches
query i through ``R_(j-i) W_V`` instead of ``W_V``. Where ``(j - i)`` times a rotary pair's
frequency is small the two maps agree; in the fast pairs they do not, and the plain switch
costs SmolLM2-135M about 1.2 nats per token. Two closed-form steps, computed from the source's
own activations on a few windows of training text, start RoVE close to its source instead:

1. **Align the values with the slow pairs.** For any invertible ``P`` per KV head,
   ``W_V -> P W_V`` and ``W_O -> W_O P^-1`` leave a RoPE model's function unchanged, since
   RoPE never rotates values. ``P`` makes the value coordinates uncorrelated and sorts them by
   the output energy each carries (eigenvectors of ``S^1/2 M S^1/2``, with ``S`` the covariance
   of the heads' attention outputs and ``M = sum_h W_O^h^T W_O^h`` over the KV head's query
   heads), then puts the coordinates that carry the most where RoVE turns them least: the
   channels without rotation (partial rotary), then the slowest pairs. The fast pairs are left
   with the least of each head's output. Each coordinate is rescaled so that its ``W_V`` row and
   ``W_O`` columns have equal norms (whitening alone would leave them unbalanced for training).
2. **Refit each output projection.** Every RoVE layer runs on its source layer's inputs (teacher
   forcing, all layers from one forward of the source), and ``W_O`` becomes the ridge
   least-squares map from that layer's RoVE attention output to the source layer's output: one
   solve of size ``Hq * D`` per layer, pulled towards the aligned ``W_O`` by ``ridge``.

The model is then plain RoVE (:func:`rove.hf.convert`): nothing of the procedure stays in the
model, so what is saved, exported and evaluated is exact RoVE with new weights.

Measured on SmolLM2-135M (``benchmarks/bench_retrofit.py``; README, "Try RoVE on a model you
already have"): in probes on six held-out 1024-token windows the alignment alone took the
conversion's cost from +1.15 to +0.21 nats, the refit to +0.14-0.18; over 3 seeds of the
benchmark the transfer starts +0.09 to +0.16 above its source (the plain switch +1.06), and
trained 24 steps at 512 tokens it ends 0.15 behind continued RoPE and 0.40 ahead of the smooth
conversion. A gradient transfer of W_V and W_O (LoLCATs-style, 30 Adam steps a layer)
after the alignment did not improve on the alignment alone, at ten times the cost, nor did a
sequential refit (each layer on the converted model's own inputs) improve on the teacher-forced
one, at nine times the cost (benchmarks/RESULTS.md, 2026-12-04).

References: LoLCATs (arXiv 2410.10254) fits a new attention to each layer's original output
before any end-to-end training; MOHAWK (arXiv 2408.10189) aligns matrices, then hidden states.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor, nn

from rove.architectures import LAYOUTS
from rove.hf.conversion import (
    _attention_modules,
    _head_dim,
    convert,
    current_pos,
    is_rotary_module,
)

__all__ = ["TRANSFER_MODEL_TYPES", "TransferReport", "align_values", "transfer"]

# the architectures whose values and outputs are projections of their own (nn.Linear), which
# the alignment changes per KV head; fused ones (Phi-3's qkv_proj, GPT-NeoX) convert plainly
TRANSFER_MODEL_TYPES: tuple[str, ...] = tuple(
    sorted(t for t, layout in LAYOUTS.items() if layout.packing == "separate")
)


@dataclass
class TransferReport:
    """What :func:`transfer` did, per attention layer, and what it cost."""

    tokens: int = 0  # calibration tokens the source read
    seconds: float = 0.0  # wall time of the whole transfer
    # share of each layer's attention-output energy in the fast half of the rotated channels,
    # before and after the alignment (the part RoVE turns most)
    fast_energy: list[tuple[float, float]] = field(default_factory=list)
    # each layer's relative squared error to its source layer's output (teacher-forced), as
    # plain RoVE after the alignment and after the refit of W_O
    refit_error: list[tuple[float, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "fast_energy": [[round(a, 5), round(b, 5)] for a, b in self.fast_energy],
            "refit_error": [[round(a, 5), round(b, 5)] for a, b in self.refit_error],
        }


class _LayerRecord:
    """One attention layer's calls during the source's forward: its inputs (keyword
    arguments), its output, and the statistics of its attention output (the out-projection's
    input) that the alignment needs."""

    def __init__(self, module: nn.Module, output: nn.Module, n_kv: int, head_dim: int) -> None:
        self.calls: list[tuple[dict[str, Any], torch.Tensor]] = []
        self.n_kv, self.head_dim = n_kv, head_dim
        self.cov: torch.Tensor | None = None  # (Hq, D, D), float64
        self.handles = [
            module.register_forward_pre_hook(self.inputs, with_kwargs=True),
            module.register_forward_hook(self.result),
            output.register_forward_pre_hook(self.attention_output),
        ]

    def inputs(self, _: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if args:
            raise RuntimeError("rove.hf.transfer needs attention modules called with keywords")
        self.calls.append((dict(kwargs), torch.empty(0)))

    def result(self, _: nn.Module, __: tuple, out: Any) -> None:
        kwargs, _empty = self.calls[-1]
        self.calls[-1] = (kwargs, (out[0] if isinstance(out, tuple) else out).detach())

    def attention_output(self, _: nn.Module, args: tuple) -> None:
        o = args[0].detach().double()  # (B, T, Hq * D)
        heads = o.reshape(-1, o.shape[-1] // self.head_dim, self.head_dim)  # (B * T, Hq, D)
        cov = torch.einsum("nhd,nhe->hde", heads, heads)
        self.cov = cov if self.cov is None else self.cov + cov

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _slow_first(head_dim: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Channel indices of a head from the one RoVE turns least to the one it turns most: the
    channels past the rotary dimension (never rotated), then the half-split pairs
    ``(m, m + r/2)`` from the lowest frequency up (HF's rotate_half convention)."""
    half = inv_freq.numel()
    order = list(range(2 * half, head_dim))
    for m in torch.argsort(inv_freq.double()).tolist():
        order += [m, m + half]
    return torch.tensor(order)


def _fast_share(energy: torch.Tensor, fast: torch.Tensor) -> float:
    return float(energy[fast].sum() / energy.sum().clamp_min(1e-300))


@torch.no_grad()
def _align_layer(
    record: _LayerRecord, value: nn.Linear, output: nn.Linear, order: torch.Tensor
) -> tuple[float, float]:
    """Change the basis of each KV head's values in place (see the module docstring, step 1);
    the share of output energy in the fast half before and after."""
    d, n_kv = record.head_dim, record.n_kv
    assert record.cov is not None  # the source ran
    n_q = record.cov.shape[0]
    group = n_q // n_kv
    w_v = value.weight.double().view(n_kv, d, -1)  # (Hkv, D, d_model)
    b_v = value.bias.double().view(n_kv, d) if value.bias is not None else None
    w_o = output.weight.double().view(-1, n_q, d)  # (d_model, Hq, D)
    fast = order[len(order) // 2 :]  # the channels in the fast half of the slot order
    before = after = 0.0
    place = torch.empty_like(order)
    place[order] = torch.arange(len(order))  # new channel c holds coordinate place[c]
    for g in range(n_kv):
        heads = slice(g * group, (g + 1) * group)
        cov = record.cov[heads].sum(0)
        metric = torch.einsum("xhd,xhe->de", w_o[:, heads], w_o[:, heads])
        before += _fast_share(torch.diagonal(cov) * torch.diagonal(metric), fast)
        evals, evecs = torch.linalg.eigh(cov)
        evals = evals.clamp_min(evals.max() * 1e-12)
        root = evecs @ torch.diag(evals.sqrt()) @ evecs.T
        inv_root = evecs @ torch.diag(evals.rsqrt()) @ evecs.T
        energy, u = torch.linalg.eigh(root @ metric @ root)
        energy, u = energy.flip(0), u.flip(1)  # most output energy first
        p, p_inv = u.T @ inv_root, root @ u  # new coordinates: p @ v
        new_v = p @ w_v[g]  # (D, d_model)
        new_o = torch.einsum("xhd,de->xhe", w_o[:, heads], p_inv)  # (d_model, group, D)
        scale = (new_o.pow(2).sum((0, 1)).sqrt() / new_v.norm(dim=1).clamp_min(1e-300)).sqrt()
        new_v, new_o, p = new_v * scale[:, None], new_o / scale, p * scale[:, None]
        w_v[g] = new_v[place]
        w_o[:, heads] = new_o[..., place]
        if b_v is not None:
            b_v[g] = (p @ b_v[g])[place]
        after += _fast_share(energy[place], fast)
    value.weight.copy_(w_v.reshape_as(value.weight))
    output.weight.copy_(w_o.reshape_as(output.weight))
    if b_v is not None:
        value.bias.copy_(b_v.reshape_as(value.bias))
    return before / n_kv, after / n_kv


def _teacher_forced(module: nn.Module, output: nn.Module, record: _LayerRecord) -> Iterator[Tensor]:
    """The layer's RoVE attention output (the out-projection's input) on its source's inputs,
    call by call."""
    got: list[Tensor] = []
    handle = output.register_forward_pre_hook(lambda _, args: got.append(args[0].detach()))
    try:
        for kwargs, _target in record.calls:
            got.clear()
            module(**kwargs)
            yield got[-1]
    finally:
        handle.remove()


@torch.no_grad()
def _refit_output(
    output: nn.Linear, inputs: Iterator[Tensor], targets: list[Tensor], ridge: float
) -> tuple[float, float]:
    """``W_O`` as the ridge least-squares map from the (now RoVE) layer's attention outputs
    ``inputs`` to its source layer's outputs ``targets``; the relative error before and after."""
    width, device = output.in_features, output.weight.device  # sums in float64 where W_O is
    gram = torch.zeros(width, width, dtype=torch.float64, device=device)
    cross = torch.zeros(width, output.out_features, dtype=torch.float64, device=device)
    target_sq = torch.zeros((), dtype=torch.float64, device=device)
    for z, target in zip(inputs, targets, strict=True):
        z = z.double().reshape(-1, width)
        y = target.double().reshape(-1, output.out_features)
        if output.bias is not None:
            y = y - output.bias.double()
        gram += z.T @ z
        cross += z.T @ y
        target_sq += y.pow(2).sum()
    w_old = output.weight.double().T  # (width, out)
    lam = ridge * torch.diagonal(gram).mean()
    w_new = torch.linalg.solve(
        gram + lam * torch.eye(width, dtype=gram.dtype, device=device), cross + lam * w_old
    )

    def error(w: Tensor) -> float:  # ||Z w - Y||^2 / ||Y||^2 from the sums
        sq = target_sq - 2 * (w * cross).sum() + (w * (gram @ w)).sum()
        return float(sq / target_sq.clamp_min(1e-300))

    before = error(w_old)
    output.weight.copy_(w_new.T)
    return before, error(w_new)


def _check_model(model: nn.Module) -> tuple[Any, list[nn.Module]]:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if hasattr(model, "peft_config"):
        raise ValueError("rove.hf.transfer: transfer the base model before adding a LoRA adapter")
    if current_pos(model) != "rope":
        raise ValueError(
            "rove.hf.transfer: the model is already RoVE; transfer starts from its RoPE source "
            "(whose activations it fits)"
        )
    if model_type not in TRANSFER_MODEL_TYPES:
        raise ValueError(
            f"rove.hf.transfer: model_type {model_type!r} is not supported (it needs separate "
            f"value and output projections: {', '.join(TRANSFER_MODEL_TYPES)}); convert it "
            "with rove.hf.convert instead"
        )
    layout = LAYOUTS[model_type]
    modules = _attention_modules(model, layout)
    for module in modules:
        for name in (layout.value, layout.output):
            if not isinstance(getattr(module, name), nn.Linear):
                raise ValueError(f"rove.hf.transfer: {name} is not an nn.Linear")
    return layout, modules


def _record(
    model: nn.Module, layout: Any, modules: list[nn.Module], windows: Iterable[torch.Tensor]
) -> tuple[list[_LayerRecord], int]:
    """One forward of the RoPE source over ``windows``: the record of each attention module of
    ``modules`` and the number of tokens read."""
    config = cast(Any, model).config
    n_kv = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    records = [_LayerRecord(m, getattr(m, layout.output), n_kv, _head_dim(m)) for m in modules]
    tokens = 0
    try:
        with torch.no_grad():
            for window in windows:
                ids = window.reshape(-1, window.shape[-1])  # (T,) or (B, T) -> (B, T)
                model(input_ids=ids, use_cache=False)
                tokens += ids.numel()
    finally:
        for record in records:
            record.remove()
    if tokens == 0:
        raise ValueError("rove.hf.transfer: no calibration windows")
    return records, tokens


def _pair_frequencies(model: nn.Module) -> torch.Tensor:
    """The rotary frequencies that order each head's channels from slow to fast. A model with
    several tables (Gemma 3: sliding and global layers) is aligned once for all of them, so
    their pairs must rank alike (true of every base-and-scaling table, whose frequency falls
    with the pair index)."""
    tables = [
        table.detach().cpu()
        for module in model.modules()
        if is_rotary_module(module)
        for name, table in module.named_buffers(recurse=False)
        if name == "inv_freq" or name.endswith("_inv_freq")
    ]
    if not tables:
        raise ValueError("rove.hf.transfer: found no rotary embedding module in the model")
    orders = {tuple(torch.argsort(t.double()).tolist()) for t in tables}
    if len(orders) > 1:
        raise ValueError(
            "rove.hf.transfer: the model's rotary tables rank their pairs differently, so no "
            "one channel order is slow-to-fast for all of them"
        )
    return tables[0]


def _align(
    model: nn.Module, windows: Iterable[torch.Tensor]
) -> tuple[TransferReport, list[nn.Module], list[_LayerRecord], Any, float]:
    """Record the source over ``windows`` and align every layer (step 1); what the refit
    needs next, and when it started."""
    started = time.perf_counter()
    layout, modules = _check_model(model)
    inv_freq = _pair_frequencies(model)
    records, tokens = _record(model, layout, modules, windows)
    report = TransferReport(tokens=tokens)
    for module, record in zip(modules, records, strict=True):
        order = _slow_first(record.head_dim, inv_freq)
        value, output = getattr(module, layout.value), getattr(module, layout.output)
        report.fast_energy.append(_align_layer(record, value, output, order))
    return report, modules, records, layout, started


def align_values(model: nn.Module, windows: Iterable[torch.Tensor]) -> TransferReport:
    """Step 1 alone: each KV head's value basis aligned with RoPE's slow pairs, in place. The
    RoPE model computes the same function after it (up to rounding); a later
    :func:`rove.hf.convert` then costs far less. ``windows``: token ids, each ``(T,)`` or
    ``(B, T)``."""
    report, *_, started = _align(model, windows)
    report.seconds = time.perf_counter() - started
    return report


def transfer(
    model: nn.Module,
    windows: Iterable[torch.Tensor],
    *,
    ridge: float = 0.1,
) -> TransferReport:
    """Convert the RoPE Hugging Face causal LM ``model`` to RoVE in place, fitted to itself:
    values aligned with the slow rotary pairs, then each output projection refit to its source
    layer (the module docstring). ``windows``: calibration token ids, each ``(T,)`` or
    ``(B, T)``, from training text (a few thousand tokens at the context the model will train
    at). ``ridge`` pulls each refit towards the aligned ``W_O`` (relative to the mean
    diagonal of its Gram matrix). Returns what it did; ``model`` ends plain RoVE
    (``current_pos(model) == "rove"``, fraction 1)."""
    if not ridge >= 0:
        raise ValueError(f"rove.hf.transfer: ridge must be >= 0, got {ridge}")
    report, modules, records, layout, started = _align(model, windows)
    convert(model, "rove")
    for module, record in zip(modules, records, strict=True):
        output = getattr(module, layout.output)
        targets = [target for _kwargs, target in record.calls]
        inputs = _teacher_forced(module, output, record)
        report.refit_error.append(_refit_output(output, inputs, targets, ridge))
        record.calls.clear()  # free the layer's inputs as soon as they served
    report.seconds = time.perf_counter() - started
    return report
