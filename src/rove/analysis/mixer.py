"""A trained attention layer as one explicit linear map: weights, attention and mixer matrix.

Once the attention weights ``A`` are fixed, a layer is linear in its input: flatten the sequence
``x`` ``(T, C)`` to ``T*C`` numbers and the layer is a ``(T*C, T*C)`` *mixer matrix* whose block
``(i, j)`` is ``sum_h A_hij W_O,h psi_h(p_j - p_i) W_V,h`` (plus a bias term when the projections
have biases). Under RoPE every block of a head is the same matrix ``W_O W_V`` scaled by ``A_ij``
(a Kronecker product ``A (x) W_O W_V``); under RoVE the block also depends on the offset, through
``psi(delta) = R_delta`` (a gated block-Toeplitz operator).

This module pulls the per-head matrices out of a ``RoveAttention``'s fused projection,
recomputes the attention weights in float64, and builds the mixer with ``rove.reference``. Its
``reconstruction_error`` closes the loop: mixer times input against the layer's real output.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from functools import partial

import torch

from rove.functional import logit_temperature
from rove.layer import RoveAttention
from rove.model import GPT
from rove.reference import mixer_matrix
from rove.rotary import Rotary, apply_rotary

__all__ = [
    "HeadWeights",
    "attention_weights",
    "capture_input",
    "head_mixer",
    "head_weights",
    "kernel_bank",
    "kronecker_defect",
    "layer_attention",
    "layer_mixer",
    "layer_output",
    "reconstruction_error",
]


@dataclass(frozen=True)
class HeadWeights:
    """The matrices of one query head, float64. GQA and shared K = V are resolved already."""

    w_q: torch.Tensor  # (D, C): query map
    w_k: torch.Tensor  # (D, C): key map of this head's KV group
    w_v: torch.Tensor  # (D, C): value map (the key map under shared KV)
    w_o: torch.Tensor  # (C, D): this head's columns of the output projection
    b_q: torch.Tensor | None  # (D,) biases, when the projections have them
    b_k: torch.Tensor | None
    b_v: torch.Tensor | None


def _check_head(attn: RoveAttention, head: int) -> None:
    if not 0 <= head < attn.n_head:
        raise ValueError(f"head {head} out of range: the layer has {attn.n_head} heads")


def head_weights(attn: RoveAttention, head: int) -> HeadWeights:
    """Slice head ``head``'s matrices out of the fused ``[q heads | k heads | v heads]`` projection."""
    _check_head(attn, head)
    dim, n_q, n_kv = attn.head_dim, attn.n_head, attn.n_kv_head
    kv = head // (n_q // n_kv)  # the KV head this query head reads
    weight = attn.qkv.weight.detach().double()  # ((Hq + 2 Hkv) D, C), or (Hq + Hkv) D if shared
    bias = attn.qkv.bias.detach().double() if attn.qkv.bias is not None else None

    def rows(index: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        sl = slice(index * dim, (index + 1) * dim)
        return weight[sl], (bias[sl] if bias is not None else None)

    w_q, b_q = rows(head)
    w_k, b_k = rows(n_q + kv)
    w_v, b_v = (w_k, b_k) if attn.shared_kv else rows(n_q + n_kv + kv)
    w_o = attn.proj.weight.detach().double()[:, head * dim : (head + 1) * dim]  # (C, D)
    return HeadWeights(w_q, w_k, w_v, w_o, b_q, b_k, b_v)


def layer_attention(model: GPT, layer: int) -> RoveAttention:
    """``model.blocks[layer].attn``, typed through :meth:`GPT.iter_blocks`."""
    return list(model.iter_blocks())[layer].attn


def capture_input(model: GPT, tokens: torch.Tensor, layer: int) -> torch.Tensor:
    """The input of ``blocks[layer].attn`` (after its LayerNorm) for ``tokens`` ``(T,)``: ``(T, C)``.

    Runs a float64 copy of the model, so the original is untouched.
    """
    if not 0 <= layer < len(model.blocks):
        raise ValueError(f"layer {layer} out of range: the model has {len(model.blocks)} blocks")
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be one sequence (T,), got shape {tuple(tokens.shape)}")
    model64 = copy.deepcopy(model).double().eval()
    seen: list[torch.Tensor] = []
    hook = layer_attention(model64, layer).register_forward_pre_hook(
        lambda _module, args: seen.append(args[0].detach())
    )
    try:
        with torch.no_grad():
            model64.hidden(tokens[None].to(model64.wte.weight.device))
    finally:
        hook.remove()
    return seen[0][0].cpu()  # (T, C)


def _rotary(attn: RoveAttention) -> Rotary | None:
    """The layer's rotary encoding; a GPT layer's is a 1-D ``Rotary``, as ``mixer_matrix`` needs."""
    if attn.rotary is not None and not isinstance(attn.rotary, Rotary):
        raise ValueError(f"the mixer needs a 1-D Rotary, got {type(attn.rotary).__name__}")
    return attn.rotary


def _rotate(attn: RoveAttention, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    assert attn.rotary is not None
    cos, sin = attn.rotary.tables(positions, torch.float64)
    return apply_rotary(x, cos, sin, convention=attn.rotary.convention)


def attention_weights(
    attn: RoveAttention, x: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Attention weights ``(H, T, T)`` of every head on ``x`` ``(T, C)``, in float64."""
    x = x.double()
    seq = x.shape[0]
    out = []
    for h in range(attn.n_head):
        w = head_weights(attn, h)
        q, k = x @ w.w_q.T, x @ w.w_k.T  # (T, D)
        if w.b_q is not None and w.b_k is not None:
            q, k = q + w.b_q, k + w.b_k
        if attn.pos != "nope":
            q, k = _rotate(attn, q, positions), _rotate(attn, k, positions)
        q, scale = logit_temperature(q, attn.rotary, attn.pos)  # the layer's temperature
        scores = scale * q @ k.T
        if attn.causal:
            scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), -math.inf)
        out.append(scores.softmax(-1))
    return torch.stack(out)


def head_mixer(
    attn: RoveAttention,
    head: int,
    weights: torch.Tensor,
    positions: torch.Tensor,
    channels: int | None = None,
) -> torch.Tensor:
    """Mixer matrix of one head, ``(T * c, T * c)``, on the first ``c = channels`` model channels.

    ``weights`` is that head's ``(T, T)`` attention (or any gate, e.g. ones, see ``kernel_bank``).
    """
    w = head_weights(attn, head)
    c = w.w_o.shape[0] if channels is None else channels
    return mixer_matrix(
        weights[None],
        w.w_v[None, :, :c],
        w.w_o[None, :c],
        pos=attn.pos,
        rotary=_rotary(attn),
        q_positions=positions,
        k_positions=positions,
    )


def kernel_bank(
    attn: RoveAttention, head: int, positions: torch.Tensor, channels: int | None = None
) -> torch.Tensor:
    """The head's mixer with ``A`` replaced by the causal (or full) mask of ones.

    What is left is the bank of offset kernels ``W_O psi(p_j - p_i) W_V`` laid out by ``(i, j)``:
    block-Toeplitz under RoVE, one repeated block under RoPE and NoPE.
    """
    seq = positions.shape[0]
    ones = torch.ones(seq, seq, dtype=torch.float64)
    return head_mixer(attn, head, ones.tril() if attn.causal else ones, positions, channels)


def layer_mixer(
    attn: RoveAttention, weights: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole layer as an affine map of the flattened input: ``(M, c)`` with ``y = M x + c``.

    Arguments:
        weights: ``(H, T, T)`` attention weights (from ``attention_weights``).
        positions: ``(T,)`` token positions.
    Returns:
        ``M`` ``(T*C, T*C)`` and ``c`` ``(T*C,)`` (zero without biases).
    """
    heads = [head_weights(attn, h) for h in range(attn.n_head)]
    w_v = torch.stack([w.w_v for w in heads])  # (H, D, C)
    w_o = torch.stack([w.w_o for w in heads])  # (H, C, D)
    mix = partial(
        mixer_matrix,
        pos=attn.pos,
        rotary=_rotary(attn),
        q_positions=positions,
        k_positions=positions,
    )
    mixer = mix(weights, w_v, w_o)
    seq, width = weights.shape[-1], w_o.shape[1]
    const = torch.zeros(seq * width, dtype=torch.float64)
    if heads[0].b_v is not None:
        # the value bias is a one-channel input equal to 1 at every token
        b_v = torch.stack([w.b_v for w in heads if w.b_v is not None])[..., None]  # (H, D, 1)
        const += mix(weights, b_v, w_o) @ torch.ones(seq, dtype=torch.float64)
    if attn.proj.bias is not None:
        const += attn.proj.bias.detach().double().repeat(seq)
    return mixer, const


def layer_output(attn: RoveAttention, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The layer's own forward on ``x`` ``(T, C)`` in float64 (float64 rotation tables too)."""
    layer = copy.deepcopy(attn).double().cpu()  # float64 weights: float64 tables too
    with torch.no_grad():
        return layer(x.double()[None], positions=positions)[0]


def reconstruction_error(attn: RoveAttention, x: torch.Tensor, positions: torch.Tensor) -> float:
    """``||M x + c - layer(x)|| / ||layer(x)||``: ~1e-15 when the mixer is the layer."""
    mixer, const = layer_mixer(attn, attention_weights(attn, x, positions), positions)
    y = layer_output(attn, x, positions)
    return float((mixer @ x.double().reshape(-1) + const - y.reshape(-1)).norm() / y.norm())


def kronecker_defect(mixer: torch.Tensor, q_len: int, k_len: int) -> float:
    """Share of the mixer's Frobenius norm outside its best Kronecker product ``A' (x) B'``.

    Van Loan's rearrangement turns ``M`` ``(Tq*a, Tk*b)`` into the ``(Tq*Tk, a*b)`` matrix of its
    flattened blocks; ``M`` is a Kronecker product iff that matrix has rank one. Returns
    ``sqrt(sum_(k>=2) s_k^2) / ||s||``: 0 for a RoPE head, > 0 when blocks vary with the offset.
    """
    rows, cols = mixer.shape
    a, b = rows // q_len, cols // k_len
    blocks = mixer.reshape(q_len, a, k_len, b).permute(0, 2, 1, 3).reshape(q_len * k_len, a * b)
    s = torch.linalg.svdvals(blocks.double())
    total = s.square().sum()
    return float((total - s[0].square()).clamp_min(0).sqrt() / total.sqrt()) if total > 0 else 0.0
