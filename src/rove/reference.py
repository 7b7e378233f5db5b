"""The slow, explicit attentive-convolution form of RoVE, for tests and analysis.

RoVE attention is an *attentive convolution*: the constant value map ``W_V`` becomes a family of
offset-indexed kernels ``psi_delta = R_delta W_V`` gated by the content-dependent weights ``A_ij``:

    y_i = W_O sum_j A_ij psi_(p_j - p_i) x_j,        psi_delta = R_delta W_V     (RoVE)
    psi_delta = W_V                                                              (RoPE, NoPE)

Everything here builds the rotation matrices ``R_delta`` explicitly (``D x D``, float64) from the
frequencies and the pair convention, and never calls the fast rotation code, so it is an
independent oracle. Viewed as one linear map on the flattened ``(token x channel)`` signal, a head
is the *mixer matrix* with blocks ``M[i, j] = A_ij W_O psi_(p_j - p_i) W_V``: a Kronecker product
``A (x) W_O W_V`` for RoPE, a gated block-Toeplitz operator for RoVE.
"""

from __future__ import annotations

import math

import torch

from rove.functional import Pos, check_pos
from rove.rotary import Rotary

__all__ = [
    "attentive_convolution",
    "mixer_matrix",
    "reference_attention",
    "rotation_matrix",
    "value_kernels",
]


def rotation_matrix(
    rotary: Rotary, delta: torch.Tensor, seq_len: int | None = None
) -> torch.Tensor:
    """Explicit ``R_delta`` of shape ``delta.shape + (D, D)`` in float64.

    Plane ``m`` rotates channels ``(a, b)`` = ``(m, m + r/2)`` (half) or ``(2m, 2m + 1)``
    (interleaved) by ``+delta * w_m``; channels past ``rotary_dim`` are left alone.
    """
    dim, half = rotary.head_dim, rotary.rotary_dim // 2
    inv_freq = rotary.frequencies(seq_len).inv_freq.to(torch.float64)
    theta = delta.to(torch.float64)[..., None] * inv_freq  # (..., r/2)
    mat = torch.zeros(*delta.shape, dim, dim, dtype=torch.float64)
    mat[..., range(dim), range(dim)] = 1.0
    for m in range(half):
        a, b = (m, m + half) if rotary.convention == "half" else (2 * m, 2 * m + 1)
        c, s = theta[..., m].cos(), theta[..., m].sin()
        mat[..., a, a], mat[..., a, b] = c, -s
        mat[..., b, a], mat[..., b, b] = s, c
    return mat


def _relative_rotations(
    rotary: Rotary | None,
    pos: str,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    dim: int,
    seq_len: int,
    fraction: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(score rotation, value kernel rotation), each ``(Tq, Tk, D, D)``, for one sequence; the
    value kernels of RoVE at a ``fraction`` a of its angles are ``R(a delta)``."""
    delta = k_pos[None, :] - q_pos[:, None]  # (Tq, Tk): p_j - p_i
    eye = torch.eye(dim, dtype=torch.float64).expand(*delta.shape, dim, dim)
    if pos == "nope":
        return eye, eye
    assert rotary is not None
    rot = rotation_matrix(rotary, delta, seq_len)
    if pos != "rove":
        return rot, eye
    return rot, (
        rot if fraction == 1 else rotation_matrix(rotary, delta.double() * fraction, seq_len)
    )


def _logit_weights(rotary: Rotary | None, pos: str, dim: int) -> tuple[torch.Tensor, float]:
    """``(w, scale)`` with logits ``scale * (w * q)^T R k``: where the YaRN temperature goes.

    ``"logits"``: all of ``q.k`` (through ``scale``); ``"rotated"``: the rotated channels only
    (HF folds the factor into cos/sin). No temperature without rotation (``nope``).
    """
    w = torch.ones(dim, dtype=torch.float64)
    if pos == "nope" or rotary is None:
        return w, 1 / math.sqrt(dim)
    if rotary.temperature == "rotated":
        w[: rotary.rotary_dim] = rotary.logit_scale
    return w, rotary.softmax_scale(dim)


def _top(*positions: torch.Tensor) -> int:
    """``max(position) + 1`` over all positions: the length that drives dynamic NTK."""
    return max((int(p.max()) + 1 for p in positions if p.numel()), default=0)


def _runs(ids: torch.Tensor) -> list[int]:
    """Number the maximal runs of equal ids: a reused id starts a new document."""
    runs, run = [], 0
    for t in range(len(ids)):
        run += int(t > 0 and ids[t] != ids[t - 1])
        runs.append(run)
    return runs


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None = None,
    *,
    pos: Pos = "rove",
    causal: bool = True,
    rotary: Rotary | None = None,
    q_positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    doc_ids: torch.Tensor | None = None,
    scale: float | None = None,
    fraction: float = 1.0,
) -> torch.Tensor:
    """Same contract as ``rove.attention``, computed pair by pair in float64.

    ``score_ij = scale * q_i^T R_(p_j - p_i) k_j`` and ``y_i = sum_j A_ij psi_(p_j - p_i) v_j``;
    under RoVE at a ``fraction`` a of its V/O angles, ``psi_delta = R(a delta)``.
    """
    check_pos(pos)
    bsz, n_q, q_len, dim = q.shape
    n_kv, k_len = k.shape[1], k.shape[2]
    v = k if v is None else v
    if pos != "nope" and rotary is None:
        rotary = Rotary(dim)
    if scale is None:
        weight, scale = _logit_weights(rotary, pos, dim)
    else:
        weight = torch.ones(dim, dtype=torch.float64)
    q_pos = torch.arange(k_len - q_len, k_len) if q_positions is None else q_positions.cpu()
    k_pos = (
        (q_pos if k_len == q_len else torch.arange(k_len))
        if k_positions is None
        else k_positions.cpu()
    )
    q, k, v = (t.detach().cpu().to(torch.float64) for t in (q, k, v))
    out = torch.zeros(bsz, n_q, q_len, dim, dtype=torch.float64)
    for b in range(bsz):
        qp = q_pos[b % q_pos.shape[0]] if q_pos.ndim == 2 else q_pos  # (1, T) broadcasts
        kp = k_pos[b % k_pos.shape[0]] if k_pos.ndim == 2 else k_pos
        seq_len = _top(q_pos, k_pos)
        score_rot, value_rot = _relative_rotations(rotary, pos, qp, kp, dim, seq_len, fraction)
        allowed = torch.ones(q_len, k_len, dtype=torch.bool)
        if causal:
            allowed &= torch.arange(k_len)[None, :] <= torch.arange(k_len - q_len, k_len)[:, None]
        if doc_ids is not None:
            runs = torch.tensor(_runs(doc_ids[b].cpu()))
            allowed &= runs[:, None] == runs[None, :]
        for h in range(n_q):
            g = h // (n_q // n_kv)  # the KV head this query head reads (GQA)
            kk, vv = k[b, g], v[b, g]  # (Tk, D)
            # scores[i, j] = q_i^T R_(p_j - p_i) k_j
            scores = scale * torch.einsum("id,ijde,je->ij", weight * q[b, h], score_rot, kk)
            weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
            out[b, h] = torch.einsum("ij,ijde,je->id", weights, value_rot, vv)
    return out


def value_kernels(
    w_v: torch.Tensor, w_o: torch.Tensor, rotary: Rotary, deltas: torch.Tensor
) -> torch.Tensor:
    """Offset kernels ``W_O R_delta W_V`` of one head, ``(len(deltas), d_out, d_in)``.

    ``w_v`` is ``(D, d_in)`` and ``w_o`` is ``(d_out, D)`` (``nn.Linear`` weight slices of the head).
    """
    rot = rotation_matrix(rotary, deltas)  # (n, D, D)
    return torch.einsum("od,nde,ei->noi", w_o.double(), rot, w_v.double())


def mixer_matrix(
    weights: torch.Tensor,
    w_v: torch.Tensor,
    w_o: torch.Tensor,
    *,
    pos: Pos,
    rotary: Rotary | None = None,
    q_positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """The layer as one linear map on the flattened signal: ``(Tq * d_out, Tk * d_in)``.

    Arguments:
        weights: attention weights ``A`` of each head, ``(H, Tq, Tk)``.
        w_v: value maps ``(H, D, d_in)``; ``w_o``: output maps ``(H, d_out, D)``.
    Block ``(i, j)`` is ``sum_h A_hij W_O,h psi_(p_j - p_i) W_V,h``. Multiplying it by the
    flattened input ``x.reshape(-1)`` gives the flattened output of the attention layer.
    """
    check_pos(pos)
    _, q_len, k_len = weights.shape
    dim = w_v.shape[1]
    q_pos = torch.arange(k_len - q_len, k_len) if q_positions is None else q_positions
    k_pos = torch.arange(k_len) if k_positions is None else k_positions
    _, value_rot = _relative_rotations(rotary, pos, q_pos, k_pos, dim, _top(q_pos, k_pos))
    blocks = torch.einsum(
        "hij,hod,ijde,hen->iojn", weights.double(), w_o.double(), value_rot, w_v.double()
    )  # (Tq, d_out, Tk, d_in)
    return blocks.reshape(q_len * w_o.shape[1], k_len * w_v.shape[2])


def attentive_convolution(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    w_o: torch.Tensor,
    *,
    pos: Pos,
    rotary: Rotary | None = None,
    causal: bool = True,
    positions: torch.Tensor | None = None,
    fraction: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A multi-head self-attention layer written as an attentive convolution (under RoVE at a
    ``fraction`` a of its V/O angles, with kernels ``R(a delta) W_V``).

    Arguments:
        x: ``(T, d_in)`` one sequence.
        w_q, w_k, w_v: ``(H, D, d_in)``; ``w_o``: ``(H, d_out, D)``.
    Returns:
        ``(y, A)``: ``y`` ``(T, d_out)`` with ``y_i = sum_h W_O,h sum_j A_hij psi_h,(p_j - p_i) x_j``
        and the weights ``A`` ``(H, T, T)``. Equal to ``mixer_matrix(A, ...) @ x.reshape(-1)``.
    """
    x = x.double()
    seq, dim = x.shape[0], w_q.shape[1]
    q = torch.einsum("hdi,ti->htd", w_q.double(), x)[None]  # (1, H, T, D)
    k = torch.einsum("hdi,ti->htd", w_k.double(), x)[None]
    at = torch.arange(seq) if positions is None else positions
    if pos != "nope" and rotary is None:
        rotary = Rotary(dim)
    weight, scale = _logit_weights(rotary, pos, dim)
    score_rot, value_rot = _relative_rotations(rotary, pos, at, at, dim, _top(at), fraction)
    scores = scale * torch.einsum("hid,ijde,hje->hij", weight * q[0], score_rot, k[0])
    if causal:
        scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    weights = scores.softmax(dim=-1)  # (H, T, T)
    # psi_(p_j - p_i) W_V x_j, then W_O: the offset-indexed value kernel applied to every token
    kernels = torch.einsum("ijde,hen->hijdn", value_rot, w_v.double())  # (H, T, T, D, d_in)
    y = torch.einsum("hij,hod,hijdn,jn->io", weights, w_o.double(), kernels, x)
    return y, weights
