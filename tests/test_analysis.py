"""Tests for rove.analysis: the mixer matrix of real layers, circuit summaries, and the CLI.

Run: /tmp/venv/bin/pytest tests/test_analysis.py -q
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from rove.analysis import (
    analyze,
    attention_weights,
    capture_input,
    circuit_summary,
    head_mixer,
    head_weights,
    kernel_bank,
    kernel_change,
    kronecker_defect,
    layer_mixer,
    layer_output,
    main,
    offset_kernels,
    plane_energy,
    qk_plane_energy,
    random_model,
    reconstruction_error,
)
from rove.layer import RoveAttention
from rove.model import GPT, get_preset
from rove.reference import value_kernels
from rove.rotary import Rotary


def nano(pos: str, seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    model = GPT(get_preset("nano", pos=pos, vocab_size=64, **overrides)).eval()
    with torch.no_grad():  # larger q/k weights than GPT-2's init, so attention is not uniform
        for block in model.blocks:
            block.attn.qkv.weight.mul_(8)
    return model


def blocks_of(mixer: torch.Tensor, seq: int) -> torch.Tensor:
    """``(T*a, T*b)`` -> ``(T, T, a, b)`` blocks."""
    a, b = mixer.shape[0] // seq, mixer.shape[1] // seq
    return mixer.reshape(seq, a, seq, b).permute(0, 2, 1, 3)


@pytest.mark.parametrize(
    "pos, overrides",
    [
        ("rove", {}),
        ("rope", {}),
        ("learned", {}),
        ("nope", {}),
        ("rove", {"n_kv_head": 1, "bias": True, "rotary_dim": 8}),
        ("rove", {"shared_kv": True, "rope_convention": "interleaved"}),
    ],
)
def test_mixer_times_input_is_the_layer_output(pos, overrides):
    model = nano(pos, **overrides)
    tokens = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(12)
    for layer in range(2):
        attn = model.blocks[layer].attn
        x = capture_input(model, tokens, layer)  # (T, C) float64
        mixer, const = layer_mixer(attn, attention_weights(attn, x, positions), positions)
        y = layer_output(attn, x, positions)
        assert y.dtype == torch.float64
        err = (mixer @ x.reshape(-1) + const - y.reshape(-1)).abs().max()
        assert err < 1e-12 * y.abs().max(), f"max error {err:.3g}"
        assert reconstruction_error(attn, x, positions) < 1e-12


def test_capture_input_is_the_layers_real_input():
    model = nano("rove")
    tokens = torch.randint(0, 64, (10,))
    x = capture_input(model, tokens, 1)
    with torch.no_grad():
        h = model.wte(tokens[None])
        h = model.blocks[0](h)  # the default positions, 0 .. 9
        expected = model.blocks[1].ln_1(h)[0]
    assert torch.allclose(x.float(), expected, atol=1e-5)
    assert next(model.parameters()).dtype == torch.float32  # the model itself is untouched


def test_rope_mixer_is_exactly_a_kronecker_product():
    model = nano("rope")
    attn = model.blocks[0].attn
    positions = torch.arange(10)
    x = capture_input(model, torch.randint(0, 64, (10,)), 0)
    weights = attention_weights(attn, x, positions)
    w = head_weights(attn, 1)
    mixer = head_mixer(attn, 1, weights[1], positions)
    assert torch.allclose(mixer, torch.kron(weights[1], w.w_o @ w.w_v), rtol=0, atol=1e-15)
    assert kronecker_defect(mixer, 10, 10) < 1e-7  # sqrt of a rounding-level residual
    rove_model = nano("rove")
    rove_attn = rove_model.blocks[0].attn
    rove_mixer = head_mixer(rove_attn, 1, weights[1], positions)
    assert kronecker_defect(rove_mixer, 10, 10) > 0.05


def test_rove_blocks_depend_on_attention_and_offset_only():
    model = nano("rove")
    attn = model.blocks[0].attn
    positions = torch.tensor([0, 1, 2, 5, 6, 7, 9])  # gaps: equal offsets off the diagonals too
    seq = len(positions)
    x = torch.randn(seq, 32, dtype=torch.float64)
    weights = attention_weights(attn, x, positions)
    w = head_weights(attn, 0)
    delta = positions[None, :] - positions[:, None]  # (T, T): p_j - p_i
    kernels = value_kernels(w.w_v, w.w_o, attn.rotary, delta.reshape(-1)).reshape(seq, seq, 32, 32)
    mixer = blocks_of(head_mixer(attn, 0, weights[0], positions), seq)
    assert torch.allclose(mixer, weights[0][..., None, None] * kernels, atol=1e-14)

    bank = blocks_of(kernel_bank(attn, 0, positions), seq)  # A := causal ones
    checked = 0
    for i in range(seq):
        for j in range(i + 1):
            for k in range(seq):
                for m in range(k + 1):
                    same = bool(delta[i, j] == delta[k, m])
                    close = torch.allclose(bank[i, j], bank[k, m], atol=1e-13)
                    assert close == same, (i, j, k, m)
                    checked += same and (i, j) != (k, m) and i - j != k - m
    assert checked > 0  # some equal offsets sit on different diagonals of the token grid


def single_head(rotary: Rotary) -> RoveAttention:
    """One head with C = D, W_O = I and every weight zero: fill in by hand."""
    dim = rotary.head_dim
    attn = RoveAttention(dim, 1, pos="rove", rotary=rotary)
    with torch.no_grad():
        attn.qkv.weight.zero_()
        attn.proj.weight.copy_(torch.eye(dim))
    return attn


@pytest.mark.parametrize("convention", ["half", "interleaved"])
def test_kernel_change_of_a_single_plane_value_map(convention):
    rotary = Rotary(8, convention=convention)
    attn = single_head(rotary)
    plane = 1  # channels (1, 5) half-split, (2, 3) interleaved; w = 10000^(-2/8) = 0.1
    a, b = (1, 5) if convention == "half" else (2, 3)
    with torch.no_grad():
        attn.qkv.weight[16 + a, 0] = 3.0  # W_V rows live in plane 1 only
        attn.qkv.weight[16 + b, 2] = -1.5
    deltas = [1, 3, 10, 31]
    freq = 10000.0 ** (-2 * plane / 8)
    expected = torch.tensor([math.sqrt(2 - 2 * math.cos(d * freq)) for d in deltas])
    assert torch.allclose(kernel_change(attn, 0, deltas), expected.double(), atol=1e-12)
    energy, rest = plane_energy(head_weights(attn, 0).w_v, rotary)
    assert torch.allclose(energy, torch.eye(4, dtype=torch.float64)[plane], atol=1e-15)
    assert abs(rest) < 1e-15


def test_plane_energy_and_qk_energy_by_hand():
    rotary = Rotary(8, 4)  # planes (0, 2), (1, 3); channels 4-7 unrotated
    w = torch.zeros(8, 3, dtype=torch.float64)
    w[0, 0], w[2, 1], w[1, 2], w[6, 0] = 1.0, 1.0, 2.0, 1.0  # energies 1 + 1, 4, and 1 unrotated
    energy, rest = plane_energy(w, rotary)
    assert torch.allclose(energy, torch.tensor([2 / 7, 4 / 7], dtype=torch.float64))
    assert rest == pytest.approx(1 / 7)
    w_q, w_k = torch.zeros(8, 3), torch.zeros(8, 3)
    w_q[0, 0] = w_k[0, 1] = 2.0  # plane 0 form: 4 e0 e1^T, norm 4
    w_q[3, 2] = w_k[3, 2] = 1.0  # plane 1 form: e2 e2^T, norm 1
    assert torch.allclose(qk_plane_energy(w_q, w_k, rotary), torch.tensor([0.8, 0.2]).double())


def test_rope_value_path_does_not_change_with_offset():
    rope = nano("rope").blocks[0].attn
    assert kernel_change(rope, 0, [1, 5, 100]).abs().max() == 0
    kernels = offset_kernels(rope, 1, [0, 7])
    assert torch.equal(kernels[0], kernels[1])
    summary = circuit_summary(nano("rove").blocks[1].attn, [1, 2, 4], context=32)
    assert summary.kernel_change.shape == (2, 3) and (summary.kernel_change > 0).all()
    assert torch.allclose(summary.v_energy.sum(-1) + summary.v_unrotated, torch.ones(2).double())
    assert summary.fast.tolist() == (summary.wavelengths <= 32).tolist()


def test_analyze_writes_report_and_figures(tmp_path):
    report = analyze(nano("rove"), tmp_path, layer=1, head=1, seq_len=8)
    text = report.read_text()
    assert "Kronecker defect" in text and "Reconstruction error" in text and "| head |" in text
    for name in ("mixer", "offset_kernels", "kernel_change", "plane_energy"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    out = tmp_path / "learned"
    analyze(nano("learned"), out, seq_len=6)  # no rotary: no circuit section
    assert "Circuits" not in (out / "report.md").read_text()


@pytest.mark.parametrize("channels", [8, 32, 100])
def test_analyze_computes_the_head_mixer_once(tmp_path, monkeypatch, channels):
    """The figure's mixer (``channels``) and the defect's (64 channels) are leading channels of
    one mixer: before, the head's mixer was computed twice. Both parts equal their own mixer."""
    import rove.analysis.report as report

    model = random_model("rove", "tiny")
    calls: list[int | None] = []

    def counted(attn, head, weights, positions, channels=None):
        calls.append(channels)
        return head_mixer(attn, head, weights, positions, channels)

    monkeypatch.setattr(report, "head_mixer", counted)
    ids = torch.randint(0, 256, (6,))
    found = report._analyze_head(model, ids, layer=0, head=1, channels=channels, context=64)
    assert calls == [max(channels, 64)]
    attn = model.blocks[0].attn
    x = capture_input(model, ids, 0)
    weights = attention_weights(attn, x, torch.arange(6))[1]
    alone = head_mixer(attn, 1, weights, torch.arange(6), channels)
    torch.testing.assert_close(found.mixer, alone, rtol=0, atol=1e-15)
    defect = kronecker_defect(head_mixer(attn, 1, weights, torch.arange(6), 64), 6, 6)
    assert found.defect == pytest.approx(defect, rel=1e-12)


def test_cli_random_and_checkpoint(tmp_path, capsys):
    assert main(["--random", "--pos", "rope", "--seq-len", "6", "--out", str(tmp_path / "r")]) == 0
    text = (tmp_path / "r" / "report.md").read_text()
    defect = re.search(r"Kronecker defect of this head's mixer .*: \*\*(\S+)\*\*", text)
    assert defect is not None and float(defect.group(1)) < 1e-6  # RoPE: a Kronecker product
    from rove.checkpoint import save_checkpoint

    ckpt = save_checkpoint(
        tmp_path / "ckpt",
        step=1,
        model=random_model("rove"),
        optimizer=None,
        tokens=0,
        train_config={},
        tokenizer={"name": "byte"},
    )
    args = [str(ckpt), "--layer", "1", "--text", "hello world", "--out", str(tmp_path / "c")]
    assert main(args) == 0
    assert "Input: 11 tokens (text)" in (tmp_path / "c" / "report.md").read_text()
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path)])  # neither a checkpoint nor --random
    with pytest.raises(ValueError, match="head 5 out of range"):
        analyze(random_model("rove"), tmp_path / "h5", head=5)


def test_an_analysis_never_silently_replaces_another(tmp_path, capsys, monkeypatch):
    """Before: the README's two ``rove analyze`` lines wrote one folder, the second silently
    replacing the first. Now each model and head has its own default folder, and a folder
    holding anything else is refused, naming --out and --force."""
    from rove.analysis.report import build_parser, default_out

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "demo" / "runs" / "rove-seed0"
    random_rove = build_parser().parse_args(["--random", "--pos", "rove"])
    assert default_out(random_rove) == Path("runs/analysis/random-rove-nano-seed0-layer0-head0")
    assert default_out(build_parser().parse_args([str(run), "--head", "1"])) == Path(
        "runs/analysis/rove-seed0-layer0-head1"
    )
    quick = ["--seq-len", "6"]
    assert main(["--random", "--pos", "rove", *quick]) == 0
    assert main(["--random", "--pos", "rope", *quick]) == 0  # its own folder
    assert sorted(p.name for p in (tmp_path / "runs" / "analysis").iterdir()) == [
        "random-rope-nano-seed0-layer0-head0",
        "random-rove-nano-seed0-layer0-head0",
    ]
    assert main(["--random", "--pos", "rove", *quick, "--out", "runs/analysis"]) == 0  # README
    out = ["--out", "shared"]
    assert main(["--random", "--pos", "rove", *quick, *out]) == 0
    first = (tmp_path / "shared" / "report.md").read_text()
    assert main(["--random", "--pos", "rove", *quick, *out]) == 0  # the same again: replaced
    capsys.readouterr()
    assert main(["--random", "--pos", "rope", *quick, *out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rove analyze: error: --out shared holds the analysis of layer 0 head 0")
    assert "choose another --out" in err and "--force" in err
    assert (tmp_path / "shared" / "report.md").read_text() == first  # untouched
    assert main(["--random", "--pos", "rope", *quick, *out, "--force"]) == 0
    assert (tmp_path / "shared" / "report.md").read_text() != first
    (tmp_path / "compare").mkdir()
    (tmp_path / "compare" / "report.md").write_text("a comparison's report")
    assert main(["--random", *quick, "--out", "compare"]) == 2
    assert "holds files of another command" in capsys.readouterr().err
    assert (tmp_path / "compare" / "report.md").read_text() == "a comparison's report"
