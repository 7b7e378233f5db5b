"""``rove analyze``: figures and a short markdown report on one layer and head of a model.

The report makes the theory of RoVE visible on real weights: the attention pattern, the mixer
matrix (Kronecker under RoPE, gated block-Toeplitz under RoVE), the offset kernels
``W_O R_delta W_V``, how fast they change with the offset, and which rotary planes the head's
value and query/key maps use. It also checks itself: the mixer times the flattened input must
reproduce the layer's own output (``reconstruction error``, ~1e-15 in float64).

Usage::

    rove analyze runs/tiny-rove --layer 1 --head 0 --out runs/tiny-rove/analysis
    rove analyze --random --pos rove --out /tmp/analysis     # random nano model, no checkpoint
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from rove.analysis.circuits import CircuitSummary, circuit_summary, offset_kernels
from rove.analysis.mixer import (
    attention_weights,
    capture_input,
    head_mixer,
    kernel_bank,
    kronecker_defect,
    layer_attention,
    reconstruction_error,
)
from rove.analysis.plots import (
    plot_kernel_change,
    plot_mixer,
    plot_offset_kernels,
    plot_plane_energy,
)
from rove.atomic import write_json_atomic, write_text_atomic
from rove.generate import refuse_export
from rove.model import GPT, MODEL_POS_CHOICES, PRESETS, GPTConfig, get_preset
from rove.terminal import DefaultsFormatter, command, signature_defaults
from rove.train.source import source_name

__all__ = ["analyze", "build_parser", "main", "random_model"]

KERNEL_DELTAS = (0, 1, 2, 4, 8, 16, 64, 256)  # offsets shown in the kernel figure
MAX_LAYER_MIXER = 8192  # T * C above which the full-layer reconstruction check is skipped


def random_model(pos: str = "rove", preset: str = "nano", seed: int = 0) -> GPT:
    """A randomly initialised model (byte-sized vocabulary) for a look without a checkpoint."""
    torch.manual_seed(seed)
    return GPT(get_preset(preset, pos=pos, vocab_size=320)).eval()


def _tokens(model: GPT, meta: dict, text: str | None, seq_len: int, seed: int) -> torch.Tensor:
    if text is None:
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(0, min(model.config.vocab_size, 256), (seq_len,), generator=gen)
    from rove.data.tokenizers import get_tokenizer

    identity = meta.get("tokenizer") or {"name": "byte"}
    ids = get_tokenizer(identity["name"]).encode(text)[:seq_len]
    if not ids:
        raise ValueError("--text encodes to no tokens")
    return torch.tensor(ids)


def _deltas(context: int, n: int = 64) -> list[int]:
    """About ``n`` log-spaced offsets in ``[1, 4 * context]``, dense enough not to alias the
    fast planes, plus the powers of 4 the report's table shows."""
    geometric = torch.logspace(0, math.log10(4 * context), n, dtype=torch.float64).round().long()
    powers = [4**k for k in range(8) if 4**k <= 4 * context]
    return sorted(set(geometric.tolist()) | set(powers))


def _circuit_table(summary: CircuitSummary) -> list[str]:
    show = [d for d in summary.deltas if d in (1, 4, 16, 64, 256, 1024)] or summary.deltas[:4]
    cols = [summary.deltas.index(d) for d in show]
    header = "| head | " + " | ".join(f"change @ {d}" for d in show)
    header += " | W_V in fast planes | QK in fast planes | W_V unrotated |"
    lines = [header, "|" + "---|" * (len(show) + 4)]
    fast_v, fast_qk = summary.v_fast_share(), summary.qk_fast_share()
    for h in range(summary.kernel_change.shape[0]):
        changes = " | ".join(f"{float(summary.kernel_change[h, c]):.3f}" for c in cols)
        lines.append(
            f"| {h} | {changes} | {float(fast_v[h]):.2f} | {float(fast_qk[h]):.2f} "
            f"| {float(summary.v_unrotated[h]):.2f} |"
        )
    return lines


@dataclass(frozen=True)
class _HeadAnalysis:
    """What the figures and the report show about one head, all computed before anything is
    written, so plotting and prose only format numbers."""

    layer: int
    head: int
    config: GPTConfig
    context: int  # training context: bounds the offsets shown, decides which planes are fast
    n_tokens: int
    attention: torch.Tensor  # (T, T): this head's attention weights
    channels: int  # channels per token in the mixer figure
    mixer: torch.Tensor  # (T * channels, T * channels): the head's mixer
    bank: torch.Tensor  # the same with the attention replaced by ones
    kernel_deltas: list[int]
    kernels: torch.Tensor  # W_O R_delta W_V at each of kernel_deltas
    defect_width: int  # channels the Kronecker defect is measured on
    defect: float
    error: float | None  # whole-layer reconstruction error; None when that mixer is too large
    circuits: CircuitSummary | None  # None for a layer without rotary planes
    rotates_values: bool  # RoVE; under RoPE only queries and keys are rotated

    @property
    def tag(self) -> str:
        return f"layer {self.layer}, head {self.head}, pos={self.config.pos}"


def analyze(
    source: str | Path | GPT,
    out_dir: str | Path,
    *,
    layer: int = 0,
    head: int = 0,
    text: str | None = None,
    tokens: torch.Tensor | None = None,
    seq_len: int = 16,
    channels: int = 8,
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Write ``report.md``, PNG figures and ``analysis.json`` (what was analysed) on ``layer`` /
    ``head`` of a model into ``out_dir``.

    A folder holding anything else (another analysis, a comparison's report) is refused with a
    ``FileExistsError`` before any work, unless ``force``; the same analysis again replaces
    its own files.

    Arguments:
        source: a checkpoint (or run folder) for ``rove.checkpoint.load_model``, or a GPT.
        text: text to run through the model (encoded with the checkpoint's tokenizer, byte
            tokenizer for a bare model); default random tokens from ``seed``.
        tokens: ``(T,)`` token ids instead of text.
        seq_len: tokens analysed (the mixer has ``(T * C)^2`` entries, so keep it short).
        channels: model channels per token shown in the mixer figures.
    Returns:
        The path of ``report.md``.
    """
    out = Path(out_dir)
    what = {
        "source": _source_label(source, seed),
        "layer": layer,
        "head": head,
        "tokens": "given" if tokens is not None else {"text": text} if text else {"seed": seed},
        "seq_len": None if tokens is not None or text else seq_len,
        "channels": channels,
    }
    _check_out(out, what, force)
    model, meta, name = _load(source)
    if not 0 <= head < model.config.n_head:
        raise ValueError(f"head {head} out of range: the model has {model.config.n_head} heads")
    ids = tokens if tokens is not None else _tokens(model, meta, text, seq_len, seed)
    found = _analyze_head(
        model,
        ids.reshape(-1).long(),
        layer=layer,
        head=head,
        channels=channels,
        context=int(meta.get("train_len") or model.config.block_size),
    )
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / ANALYSIS_FILE, what)  # first: the folder is this analysis's now
    _plot(found, out)
    given = "given" if tokens is not None else "text" if text else f"random, seed {seed}"
    report = out / "report.md"
    write_text_atomic(report, "\n".join(_report_lines(found, name, given)) + "\n")
    return report


ANALYSIS_FILE = "analysis.json"  # what an analysis folder holds the analysis of


def _source_label(source: str | Path | GPT, seed: int) -> str:
    if isinstance(source, GPT):
        cfg = source.config
        return f"a {cfg.pos} model passed in ({cfg.n_layer} layers, {cfg.n_embd} wide)"
    return str(Path(source).expanduser().resolve())


def _check_out(out: Path, what: dict, force: bool) -> None:
    """Refuse an output folder that holds something other than this same analysis."""
    if force or not out.exists():
        return
    if not out.is_dir():
        raise FileExistsError(f"--out {out} is a file; choose a folder")
    record = out / ANALYSIS_FILE
    if record.is_file():
        try:
            before = json.loads(record.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            before = None
        if before == json.loads(json.dumps(what)):
            return  # the same analysis again: its own files, replaced
        held = (
            f"the analysis of layer {before.get('layer')} head {before.get('head')} of "
            f"{before.get('source')}"
            if isinstance(before, dict)
            else f"an unreadable {ANALYSIS_FILE}"
        )
    elif any(p.is_file() for p in out.iterdir()):  # folders in it are not replaced
        held = "files of another command"
    else:
        return
    raise FileExistsError(
        f"--out {out} holds {held}; rove analyze never replaces it silently: choose another "
        "--out (the default is a folder per model and head), or add --force to replace it"
    )


def _load(source: str | Path | GPT) -> tuple[GPT, dict, str]:
    """(model in eval pos, its checkpoint's meta.json or ``{}`` for a model passed in, name)."""
    if isinstance(source, GPT):
        return source.eval(), {}, "model passed in"
    from rove.checkpoint import load_model

    model, meta = load_model(source)
    return model, meta, str(meta.get("checkpoint", source))


def _analyze_head(
    model: GPT, ids: torch.Tensor, *, layer: int, head: int, channels: int, context: int
) -> _HeadAnalysis:
    """Run ``ids`` up to ``layer`` and take ``head`` apart, in float64."""
    cfg = model.config
    positions = torch.arange(ids.shape[0])
    attn = layer_attention(model, layer)
    x = capture_input(model, ids, layer)  # (T, C), float64
    attention = attention_weights(attn, x, positions)[head]
    channels = min(channels, cfg.n_embd)
    kernel_deltas = [d for d in KERNEL_DELTAS if d <= 4 * context]
    defect_width = min(cfg.n_embd, 64)
    n = len(ids)
    layer_mixer_fits = n * cfg.n_embd <= MAX_LAYER_MIXER
    # the figure's mixer and the defect's are the leading channels of one: compute the wider
    widest = head_mixer(attn, head, attention, positions, max(channels, defect_width))
    return _HeadAnalysis(
        layer=layer,
        head=head,
        config=cfg,
        context=context,
        n_tokens=n,
        attention=attention,
        channels=channels,
        mixer=_leading_channels(widest, n, channels),
        bank=kernel_bank(attn, head, positions, channels),
        kernel_deltas=kernel_deltas,
        kernels=offset_kernels(attn, head, kernel_deltas),
        defect_width=defect_width,
        defect=kronecker_defect(_leading_channels(widest, n, defect_width), n, n),
        error=reconstruction_error(attn, x, positions) if layer_mixer_fits else None,
        circuits=None if attn.rotary is None else circuit_summary(attn, _deltas(context), context),
        rotates_values=attn.pos == "rove",
    )


def _leading_channels(mixer: torch.Tensor, n_tokens: int, channels: int) -> torch.Tensor:
    """The mixer of a head's first ``channels`` channels, cut out of its mixer of more: block
    (i, j) of either is ``A_ij W_O psi W_V`` restricted to those channels."""
    width = mixer.shape[0] // n_tokens
    blocks = mixer.reshape(n_tokens, width, n_tokens, width)[:, :channels, :, :channels]
    return blocks.reshape(n_tokens * channels, n_tokens * channels)


def _plot(found: _HeadAnalysis, out: Path) -> None:
    """The PNG figures ``report.md`` links to."""
    plot_mixer(
        found.attention, found.mixer, found.bank, found.channels, out / "mixer.png", title=found.tag
    )
    plot_offset_kernels(found.kernels, found.kernel_deltas, out / "offset_kernels.png")
    if found.circuits is not None:
        plot_kernel_change(found.circuits, out / "kernel_change.png", head=found.head)
        plot_plane_energy(found.circuits, found.head, out / "plane_energy.png")


def _report_lines(found: _HeadAnalysis, name: str, given: str) -> list[str]:
    """The markdown report: what was analysed, then a section per figure and what it shows."""
    cfg = found.config
    lines = [
        f"# RoVE analysis: {found.tag}",
        "",
        f"Model: {name}; {cfg.n_layer} layers, {cfg.n_head} heads, width {cfg.n_embd}, "
        f"training context {found.context}. Input: {found.n_tokens} tokens ({given}).",
        *_mixer_section(found),
        *_offset_kernel_section(),
    ]
    if found.circuits is not None:
        lines += _circuit_section(found.circuits, found.context, found.rotates_values)
    return lines


def _mixer_section(found: _HeadAnalysis) -> list[str]:
    """The mixer figure, what its blocks are, and the two numbers that check the theory."""
    lines = [
        "",
        "## Mixer matrix",
        "",
        "With the attention weights A fixed, the layer is one linear map on the flattened "
        "(token x channel) sequence. Block (i, j) of a head's mixer is "
        "`A_ij W_O psi(p_j - p_i) W_V`: under RoPE `psi = I` and the mixer is the Kronecker "
        "product `A (x) W_O W_V`; under RoVE `psi(delta) = R_delta` and, with A replaced by "
        "ones, the blocks depend only on the offset (block-Toeplitz).",
        "",
        "![mixer](mixer.png)",
        "",
        f"- Kronecker defect of this head's mixer (first {found.defect_width} channels): "
        f"**{found.defect:.3g}** (share of its norm outside the best `A' (x) B'`; 0 for RoPE/NoPE).",
    ]
    if found.error is not None:
        lines.append(
            f"- Reconstruction error `||M x + c - layer(x)|| / ||layer(x)||` of the whole "
            f"layer: **{found.error:.2g}** (float64)."
        )
    return lines


def _offset_kernel_section() -> list[str]:
    return [
        "",
        "## Offset kernels",
        "",
        "The value map a token at offset delta contributes through, `W_O R_delta W_V` "
        "(first 32 channels). Under RoPE all panels are the same matrix.",
        "",
        "![offset kernels](offset_kernels.png)",
    ]


def _circuit_section(summary: CircuitSummary, context: int, rotates_values: bool) -> list[str]:
    """How offset-dependent each head's OV circuit is, and which planes it uses."""
    rope_note = (
        ""
        if rotates_values
        else " This is a RoPE layer: its value path is not rotated, so the W_V plane "
        "energies only show what RoVE *would* rotate."
    )
    return [
        "",
        "## Circuits",
        "",
        "`change @ d` is `||psi_d - psi_0||_F / ||psi_0||_F` (0 under RoPE). A plane is "
        f"*fast* when it turns at least once within the context ({context} tokens). A RoVE "
        "head with value energy in fast planes has a strongly offset-dependent OV circuit; "
        "one using only slow planes behaves like RoPE." + rope_note,
        "",
        *_circuit_table(summary),
        "",
        "![kernel change](kernel_change.png)",
        "",
        "![plane energy](plane_energy.png)",
    ]


def build_parser() -> argparse.ArgumentParser:
    """``rove analyze``'s flags; their defaults are those of ``analyze`` and ``random_model``."""
    parser = argparse.ArgumentParser(
        prog="rove analyze",
        description="Mixer matrix, offset kernels and circuit summaries of one attention head.",
        formatter_class=DefaultsFormatter,
    )
    src = parser.add_argument_group("model")
    src.add_argument("checkpoint", nargs="?", help="checkpoint or run folder (omit with --random)")
    src.add_argument("--random", action="store_true", help="analyse a randomly initialised model")
    src.add_argument(
        "--pos", choices=MODEL_POS_CHOICES, help="position encoding of the random model"
    )
    src.add_argument("--preset", choices=sorted(PRESETS), help="size of the random model")
    what = parser.add_argument_group("what to analyse")
    what.add_argument("--layer", type=int, help="block index")
    what.add_argument("--head", type=int, help="query head index")
    what.add_argument("--text", help="input text; default: random tokens")
    what.add_argument("--seq-len", type=int, help="tokens analysed")
    what.add_argument("--channels", type=int, help="channels per token in the figures")
    what.add_argument("--seed", type=int, help="seed of the random model and tokens")
    parser.add_argument(
        "--out",
        help="output folder for report.md, PNGs and analysis.json; default "
        f"{ANALYSIS_ROOT}/<run>-layer<L>-head<H> (a random model: random-<pos>-<preset>-seed<S>-"
        "layer<L>-head<H>), one per model and head. A folder that holds anything else, another "
        "analysis included, is refused: outputs are never replaced silently",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace what --out holds (the files it writes)"
    )
    parser.set_defaults(
        **signature_defaults(random_model, "pos", "preset"),
        **signature_defaults(analyze, "layer", "head", "text", "seq_len", "channels", "seed"),
    )
    return parser


ANALYSIS_ROOT = Path("runs") / "analysis"


def default_out(args: argparse.Namespace) -> Path:
    """``--out``'s default: a folder per model and head, so two analyses never share one."""
    if args.random:
        model = f"random-{args.pos}-{args.preset}-seed{args.seed}"
    else:
        model = source_name(args.checkpoint)
    return ANALYSIS_ROOT / f"{model}-layer{args.layer}-head{args.head}"


@command("rove analyze", build_parser)
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.random == (args.checkpoint is not None):
        parser.error("give a CHECKPOINT or --random (exactly one)")
    if args.checkpoint is not None:
        refuse_export(
            args.checkpoint,
            "rove analyze",
            "reads the layers of rove's own GPT (its rotations and mixers), which an export "
            "stores in Hugging Face form",
        )
    source = random_model(args.pos, args.preset, args.seed) if args.random else args.checkpoint
    report = analyze(
        source,
        args.out or default_out(args),
        layer=args.layer,
        head=args.head,
        text=args.text,
        seq_len=args.seq_len,
        channels=args.channels,
        seed=args.seed,
        force=args.force,
    )
    print(f"wrote {report}")
    return 0
