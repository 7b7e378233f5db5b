"""Tests for rove.group: attention under a user-supplied group representation (GTA-style).

Run: /tmp/venv/bin/pytest tests/test_group.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

import rove
from rove.group import (
    apply_representation,
    group_attention,
    random_rotations,
    rotary_representation,
    se3_representation,
    so3_representation,
)
from rove.rotary import Rotary


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float) -> None:
    diff = (actual.double() - expected.double()).abs()
    assert diff.max() <= atol, f"max diff {diff.max():.3g}, mean diff {diff.mean():.3g}"


def full_matrix(blocks: torch.Tensor, dim: int) -> torch.Tensor:
    """``(n, k, k)`` blocks -> ``(dim, dim)`` block-diagonal matrix, identity past ``n * k``."""
    mat = torch.eye(dim, dtype=torch.float64)
    n, size = blocks.shape[0], blocks.shape[-1]
    mat[: n * size, : n * size] = torch.block_diag(*blocks.double())
    return mat


def reference(q, k, v, q_rep, k_rep, pos):
    """score_ij = q_i^T rho_i^-1 rho_j k_j; y_i = sum_j A_ij rho_i^-1 rho_j v_j (rove), float64."""
    bsz, heads, q_len, dim = q.shape
    k_len = k.shape[2]
    out = torch.zeros(bsz, heads, q_len, dim, dtype=torch.float64)
    for b in range(bsz):
        rq = [full_matrix(q_rep[b, i], dim) for i in range(q_len)]
        rk = [full_matrix(k_rep[b, j], dim) for j in range(k_len)]
        rel = torch.stack(
            [
                torch.stack([torch.linalg.solve(rq[i], rk[j]) for j in range(k_len)])
                for i in range(q_len)
            ]
        )  # (Tq, Tk, D, D): rho(g_i^-1 g_j)
        for h in range(heads):
            g = h // (heads // k.shape[1])
            scores = torch.einsum("id,ijde,je->ij", q[b, h].double(), rel, k[b, g].double())
            weights = (scores / math.sqrt(dim)).softmax(-1)
            if pos == "rove":
                out[b, h] = torch.einsum("ij,ijde,je->id", weights, rel, v[b, g].double())
            else:
                out[b, h] = weights @ v[b, g].double()
    return out


def poses(bsz: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    rot = random_rotations(bsz, seq, generator=gen)
    return rot, torch.randn(bsz, seq, 3, generator=gen, dtype=torch.float64) * 0.5


def test_random_rotations_are_rotations():
    rot = random_rotations(50, generator=torch.Generator().manual_seed(0))
    assert_close(rot.transpose(-1, -2) @ rot, torch.eye(3).expand(50, 3, 3), atol=1e-12)
    assert_close(torch.linalg.det(rot), torch.ones(50), atol=1e-12)


def test_apply_representation_is_block_diagonal_matmul():
    rot, _ = poses(2, 4, 0)
    rep = so3_representation(rot, 3)  # (2, 4, 3, 3, 3)
    x = torch.randn(2, 2, 4, 11, dtype=torch.float64)  # 9 transformed channels + 2 passed through
    y = apply_representation(x, rep)
    for b in range(2):
        for t in range(4):
            assert_close(y[b, :, t], x[b, :, t] @ full_matrix(rep[b, t], 11).T, atol=1e-12)
    assert_close(apply_representation(y, rep, transpose=True), x, atol=1e-12)


@pytest.mark.parametrize("pos", ["rope", "rove"])
@pytest.mark.parametrize("group", ["so3", "se3"])
def test_matches_explicit_relative_reference(pos, group):
    torch.manual_seed(0)
    rot, trans = poses(2, 5, 1)
    if group == "so3":
        rep, orthogonal = so3_representation(rot, 4), True  # 12 of 13 channels
    else:
        rep, orthogonal = se3_representation(rot, trans, 3), False
    q = torch.randn(2, 4, 5, 13, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 5, 13, dtype=torch.float64) for _ in range(2))  # GQA
    out = group_attention(q, k, v, rep, rep, pos=pos, orthogonal=orthogonal)
    assert_close(out, reference(q, k, v, rep, rep, pos), atol=1e-9)


@pytest.mark.parametrize("group", ["so3", "se3"])
def test_invariant_to_a_global_change_of_frame(group):
    torch.manual_seed(1)
    rot, trans = poses(2, 6, 2)
    h_rot, h_trans = poses(1, 1, 3)  # one global pose h, left-multiplied onto every pose
    q, k, v = (torch.randn(2, 3, 6, 12, dtype=torch.float64) for _ in range(3))
    orthogonal = group == "so3"

    def rep_of(r, t):
        return so3_representation(r, 4) if orthogonal else se3_representation(r, t, 3)

    moved_rot = h_rot[0, 0] @ rot  # h g: (R_h R, R_h t + t_h)
    moved_trans = trans @ h_rot[0, 0].T + h_trans[0, 0]

    def run(r, t):
        rep = rep_of(r, t)
        return group_attention(q, k, v, rep, rep, pos="rove", orthogonal=orthogonal)

    base = run(rot, trans)
    assert_close(run(moved_rot, moved_trans), base, atol=1e-10)
    # but moving a single token's pose does change the output
    rot2 = rot.clone()
    rot2[:, 0] = h_rot[0, 0] @ rot2[:, 0]
    assert (run(rot2, trans) - base).abs().max() > 1e-3


@pytest.mark.parametrize("pos", ["rope", "rove"])
@pytest.mark.parametrize("rotary_dim", [16, 10])
def test_rotary_representation_reproduces_the_rove_path(pos, rotary_dim):
    torch.manual_seed(2)
    rotary = Rotary(16, rotary_dim, convention="interleaved")
    at = torch.tensor([0, 3, 4, 9, 20, 21])
    rep = rotary_representation(rotary, at)  # (T, r/2, 2, 2)
    q = torch.randn(2, 4, 6, 16)
    k, v = (torch.randn(2, 2, 6, 16) for _ in range(2))
    ours = group_attention(q, k, v, rep, rep, pos=pos, causal=True)
    theirs = rove.attention(
        q, k, v, pos=pos, causal=True, rotary=rotary, q_positions=at, k_positions=at
    )
    assert_close(ours, theirs, atol=1e-5)


def test_errors_name_the_problem():
    q = torch.randn(1, 1, 3, 6)
    rep = so3_representation(random_rotations(3), 2)
    with pytest.raises(ValueError, match="not orthogonal"):
        group_attention(q, q, q, rep * 2, rep * 2)
    with pytest.raises(ValueError, match="acts on 3 x 3 = 9 > 6 channels"):
        group_attention(q, q, q, so3_representation(random_rotations(3), 3), rep)
    with pytest.raises(ValueError, match="tokens are"):
        group_attention(q, q, q, rep[:2], rep)
    with pytest.raises(ValueError, match="interleaved"):
        rotary_representation(Rotary(6), torch.arange(3))
    with pytest.raises(ValueError, match="choose 'rope' or 'rove'"):
        group_attention(q, q, q, rep, rep, pos="nope")  # type: ignore[arg-type]
