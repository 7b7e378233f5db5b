"""Tests for rove.rotary.nd (N-D rotary: axial and mixed layouts) and its use in attention.

Run: /tmp/venv/bin/pytest tests/test_nd.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

import rove
from rove.layer import RoveAttention
from rove.rotary import Rotary
from rove.rotary.nd import NDRotary, grid_positions


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float = 0.0):
    diff = (actual.double() - expected.double()).abs()
    ok = torch.allclose(actual.double(), expected.double(), atol=atol, rtol=rtol)
    assert ok, f"max diff {diff.max():.3g}, mean diff {diff.mean():.3g}"


def pair_channels(m: int, rotary_dim: int, convention: str) -> tuple[int, int]:
    half = rotary_dim // 2
    return (m, m + half) if convention == "half" else (2 * m, 2 * m + 1)


def relative_rotation(rotary: NDRotary, delta: torch.Tensor) -> torch.Tensor:
    """Explicit float64 ``R_delta`` for one offset vector ``delta`` ``(n_axes,)``: ``(D, D)``."""
    freqs = rotary.frequency_matrix().detach().double()
    mat = torch.eye(rotary.head_dim, dtype=torch.float64)
    for m in range(rotary.rotary_dim // 2):
        theta = float(sum(float(delta[a]) * float(freqs[m, a]) for a in range(rotary.n_axes)))
        a, b = pair_channels(m, rotary.rotary_dim, rotary.convention)
        mat[a, a], mat[a, b] = math.cos(theta), -math.sin(theta)
        mat[b, a], mat[b, b] = math.sin(theta), math.cos(theta)
    return mat


def reference(q, k, v, rotary, q_pos, k_pos, pos):
    """Pair-by-pair float64 attention: score = q_i^T R_(p_j - p_i) k_j; rove values R_(p_j - p_i) v_j."""
    q, k, v = q.double(), k.double(), v.double()
    bsz, heads, q_len, dim = q.shape
    k_len = k.shape[2]
    out = torch.zeros_like(q)
    for b in range(bsz):
        qp = q_pos[b] if q_pos.ndim == 3 else q_pos
        kp = k_pos[b] if k_pos.ndim == 3 else k_pos
        rot = torch.stack(
            [
                torch.stack([relative_rotation(rotary, kp[j] - qp[i]) for j in range(k_len)])
                for i in range(q_len)
            ]
        )  # (Tq, Tk, D, D)
        value_rot = rot if pos == "rove" else torch.eye(dim, dtype=torch.float64)
        for h in range(heads):
            scores = torch.einsum("id,ijde,je->ij", q[b, h], rot, k[b, h]) / math.sqrt(dim)
            weights = scores.softmax(-1)
            if pos == "rove":
                out[b, h] = torch.einsum("ij,ijde,je->id", weights, value_rot, v[b, h])
            else:
                out[b, h] = weights @ v[b, h]
    return out


def test_grid_positions_row_major():
    g = grid_positions(2, 3)
    assert g.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    assert grid_positions(2, 3, 4).shape == (24, 3)
    with pytest.raises(ValueError, match="positive ints"):
        grid_positions(0, 3)


def test_axial_frequencies_by_hand():
    rot = NDRotary(16, 2, layout="axial", base=100.0)
    expected = torch.zeros(8, 2, dtype=torch.float64)
    for i in range(4):
        expected[i, 0] = expected[4 + i, 1] = 100.0 ** (-i / 4)
    assert torch.equal(rot.frequency_matrix(), expected)
    uneven = NDRotary(12, 3, planes_per_axis=(3, 2, 1)).frequency_matrix()
    assert (uneven != 0).sum(0).tolist() == [3, 2, 1]


def test_mixed_keeps_magnitudes_and_is_seeded():
    axial = NDRotary(24, 3, layout="axial").frequency_matrix()
    mixed = NDRotary(24, 3, layout="mixed", seed=3).frequency_matrix()
    assert_close(mixed.norm(dim=-1), axial.norm(dim=-1), atol=1e-12)
    assert (mixed != 0).all()  # every plane sees every axis
    assert torch.equal(mixed, NDRotary(24, 3, layout="mixed", seed=3).frequency_matrix())
    assert not torch.equal(mixed, NDRotary(24, 3, layout="mixed", seed=4).frequency_matrix())


def test_one_axis_axial_is_ordinary_rotary():
    nd, oned = NDRotary(16, 1, base=10000.0), Rotary(16, base=10000.0)
    at = torch.arange(40)
    nd_tables, oned_tables = nd.tables(at[:, None], torch.float64), oned.tables(at, torch.float64)
    for a, b in zip(nd_tables, oned_tables, strict=True):
        assert_close(a, b, atol=1e-14)


@pytest.mark.parametrize("layout", ["axial", "mixed"])
@pytest.mark.parametrize("convention", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_rotate_matches_explicit_matrix_and_inverts(layout, convention, rotary_dim):
    rot = NDRotary(12, 2, rotary_dim, layout=layout, convention=convention, seed=1)
    at = torch.rand(7, 2, dtype=torch.float64) * 10
    x = torch.randn(2, 3, 7, 12, dtype=torch.float64)
    y = rot.rotate(x, at)
    origin = torch.zeros(2, dtype=torch.float64)
    mats = torch.stack([relative_rotation(rot, at[t] - origin) for t in range(7)])  # R_p
    assert_close(y, torch.einsum("tde,bhte->bhtd", mats, x), atol=1e-12)
    assert_close(rot.unrotate(y, at), x, atol=1e-12)
    x32 = x.float()
    assert_close(rot.unrotate(rot.rotate(x32, at.float()), at.float()), x32, atol=1e-6)


@pytest.mark.parametrize("pos", ["rope", "rove"])
@pytest.mark.parametrize("layout", ["axial", "mixed"])
@pytest.mark.parametrize("convention", ["half", "interleaved"])
@pytest.mark.parametrize("n_axes", [2, 3])
def test_attention_matches_float64_reference(pos, layout, convention, n_axes):
    torch.manual_seed(0)
    head_dim = 12
    rot = NDRotary(head_dim, n_axes, layout=layout, convention=convention, base=10.0, seed=2)
    sizes = (2, 3) if n_axes == 2 else (2, 2, 2)
    at = grid_positions(*sizes)
    t = at.shape[0]
    q, k, v = (torch.randn(2, 2, t, head_dim, dtype=torch.float64) for _ in range(3))
    out = rove.attention(q, k, v, pos=pos, causal=False, rotary=rot, q_positions=at, k_positions=at)
    assert_close(out, reference(q, k, v, rot, at, at, pos), atol=1e-10)


def test_batched_float_positions_match_reference():
    torch.manual_seed(1)
    rot = NDRotary(12, 3, layout="mixed", base=10.0)
    # point clouds: a different set of points per sample (float64, so p_j - p_i is exact)
    q_pos = torch.randn(2, 4, 3, dtype=torch.float64) * 3
    k_pos = torch.randn(2, 5, 3, dtype=torch.float64) * 3
    q = torch.randn(2, 2, 4, 12, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 5, 12, dtype=torch.float64) for _ in range(2))
    out = rove.attention(
        q, k, v, pos="rove", causal=False, rotary=rot, q_positions=q_pos, k_positions=k_pos
    )
    assert_close(out, reference(q, k, v, rot, q_pos, k_pos, "rove"), atol=1e-10)


@pytest.mark.parametrize("pos", ["rope", "rove"])
@pytest.mark.parametrize("layout", ["axial", "mixed"])
def test_translation_of_the_grid_changes_nothing(pos, layout):
    torch.manual_seed(2)
    rot = NDRotary(16, 2, layout=layout)
    grid = grid_positions(4, 5)
    q, k, v = (torch.randn(1, 2, 20, 16) for _ in range(3))

    def run(at):
        return rove.attention(
            q, k, v, pos=pos, causal=False, rotary=rot, q_positions=at, k_positions=at
        )

    base = run(grid)
    assert_close(run(grid + torch.tensor([7, -3])), base, atol=1e-5)
    assert_close(run(grid.double() + torch.tensor([0.25, 11.5])), base, atol=1e-5)
    # not a trivial invariance: a scaled grid changes the output
    assert (run(grid * 2) - base).abs().max() > 1e-3


def test_rove_attention_layer_accepts_nd_rotary():
    torch.manual_seed(3)
    rot = NDRotary(8, 2)
    layer = RoveAttention(32, 4, pos="rove", rotary=rot, causal=False).double()
    grid = grid_positions(3, 3)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    y = layer(x, positions=grid)
    q, k, v = layer.qkv(x).view(2, 9, 12, 8).transpose(1, 2).split(4, dim=1)
    ref = reference(q, k, v, rot, grid, grid, "rove")  # (B, H, T, D)
    assert_close(y, layer.proj(ref.transpose(1, 2).reshape(2, 9, 32)), atol=1e-10)


def test_learned_frequencies_get_gradients():
    rot = NDRotary(8, 2, layout="mixed", learned=True)
    assert [n for n, _ in rot.named_parameters()] == ["freqs"]
    x = torch.randn(3, 8)
    rot.rotate(x, torch.rand(3, 2)).square().mul(torch.randn(3, 8)).sum().backward()
    assert rot.freqs.grad is not None and rot.freqs.grad.abs().sum() > 0
    assert list(NDRotary(8, 2).parameters()) == []
    # also through rove.attention, whose kernels take the differentiable path for learned tables
    rot.freqs.grad = None
    q, k, v = torch.randn(3, 1, 2, 5, 8).unbind(0)
    at = torch.rand(5, 2) * 4
    rove.attention(q, k, v, rotary=rot, q_positions=at, k_positions=at).sum().backward()
    assert rot.freqs.grad is not None and rot.freqs.grad.abs().sum() > 0


def test_errors_name_the_problem():
    rot = NDRotary(8, 2)
    with pytest.raises(ValueError, match=r"\(5, 2\) or \(batch, 5, 2\)"):
        rot.check_positions(torch.zeros(5), 5)
    with pytest.raises(TypeError, match="real"):
        rot.check_positions(torch.zeros(5, 2, dtype=torch.complex64), 5)
    rot.check_positions(torch.zeros(5, 2, dtype=torch.long), 5)
    rot.check_positions(torch.zeros(3, 5, 2), 5)
    with pytest.raises(ValueError, match="planes_per_axis"):
        NDRotary(12, 4)
    with pytest.raises(ValueError, match="layout='mixed'"):
        NDRotary(8, 2, learned=True)
    with pytest.raises(ValueError, match="unknown layout"):
        NDRotary(8, 2, layout="diagonal")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"q_positions must have shape \(4, 2\)"):
        q = torch.randn(1, 1, 4, 8)
        rove.attention(q, q, q, pos="rove", rotary=rot, q_positions=torch.arange(4))
