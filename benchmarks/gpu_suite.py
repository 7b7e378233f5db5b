"""The GPU suite: one command that validates and measures rove on one GPU, in about 9 minutes
(an estimate until a run measures it).

On the device (the exact command, ``DEVICE_COMMAND``; nothing carried along: the image has every
package the suite imports; the log and the results come back in $OUT):

    set -o pipefail; PYTHONPATH=src PYTHONUNBUFFERED=1 timeout -k 20 530 python3 benchmarks/gpu_suite.py 2>&1 | tee $OUT/gpu_suite.log; s=${PIPESTATUS[0]}; echo "timeout exit status $s"; exit $s

    PYTHONPATH=src python benchmarks/gpu_suite.py --dry-run   # CPU, tiny sizes: code paths only

The command exits with the suite's status: 0; 1 when a kernel check failed or a stage broke (a
failed CUDA-graph capture among them); 128 + N when signal N stopped it; and ``timeout``'s own
124 when it sent TERM (the suite's stages past 530 s) or 137 when it had to KILL (20 s later).

Stages, each under a wall-clock watchdog (``--budget STAGE=SECONDS``, inside ``--total``) that
also bounds its warm-up and compiles: a stage past its share is stopped, recorded as "over
budget" with what it had measured, and the suite goes on. A stage that cannot run (no CUDA, no
Triton, no pytest, out of memory) is skipped with the reason. After every stage, after every
timed group and on SIGINT or SIGTERM, ``gpu_suite.json`` and ``gpu_suite.md`` are rewritten
atomically (under ``$OUT`` when it is set), so a run cut short, even by SIGKILL, still returns
every stage it finished and the groups of the one in flight. Goals are computed after each
group: a stage over budget keeps every goal it measured, and each goal names the rows it came
from (their mode, eager or compiled, and timing, kernel or dispatch).

The stages run in the order of ``STAGES``: every goal's timed work first (tests, then graphs,
fused_attention, attention, train), what no goal reads after (rotation; attention_torch and the
pilot are opt-in), so a run short of time loses rows no goal needs before any goal's. The
default run's budgets sum to 470 s of the 490 s total; each is an estimate for an H200 with
every compile counted, itemized where ``BUDGETS`` is set (train: three cold compiles of the
GPT-2 124M step at ~45 s each, with 40 % to spare). SIGALRM (the watchdog) and TERM cannot
interrupt a backward compile on autograd's device thread, so a stage can overrun by one compile:
the command's ``timeout`` leaves 40 s past the total for that and start-up, and ``-k 20`` kills
a run that still has not stopped. The suite prints its own exit status last.

a. ``tests``: the ``gpu``-marked tests (the whole Triton test file among them), then every
   rotation op (split, merge, rotate, un-rotate; RoPE and RoVE, GQA, shared KV, partial and
   interleaved rotary, per-sequence tables, a masked tail of T = 1000 and 10 heads), torch path
   and Triton, fp32 and bf16, forward and gradient, against an independent float64 formula;
b. ``graphs`` (goal 1): in a child process with its own CUDA context (a capture that fails,
   even one that breaks the context, costs this stage alone and is recorded), the Triton
   launchers as N calls captured in one CUDA graph, against copies graphed the same way (rows
   "kernel": the kernels alone), on tensors of at least 4x the L2 cache;
c. ``fused_attention`` (the fused kernel's goals): ``bench_attention.fused_attention_rows`` (a
   "not built" row until it exists): the fused RoVE attention kernel against RoPE + SDPA,
   forward and forward + backward, T = 1k to 16k, with the kernel's TFLOP/s against the H200's
   dense bf16 peak; its 124M goal is the train stage's compiled rove/rope;
d. ``attention`` (goal 2): one attention layer at T = 1024 (``--seqs``): nope / rope / rove,
   fused (Triton) vs torch eager, then the fused path compiled, forward and forward + backward,
   SDPA alone as the yardstick;
e. ``train`` (goals 3-5): GPT-2 124M training step (B = 32 or the largest that fits, T = 1024,
   bf16 autocast, fused AdamW): rope / rove / nope through rove's own ``train_step`` and the
   minimal reference step of ``bench_train.py`` eager, then rope and rove compiled in a group,
   then the compiled reference beside rope again; peak memory of each;
f. ``rotation`` (no goal): every rotation pass called from Python (rows "dispatch": the
   launchers, the public ops with autograd, the torch formula eager and Inductor-compiled; the
   dispatch of ``wrap_triton`` alone is ~1 ms of CPU per call, can exceed the kernel), vs copies;
g. ``attention_torch`` (opt-in): the torch path's attention layers compiled;
h. ``pilot`` (opt-in): small RoPE and RoVE models trained on the embedded corpus with the byte
   tokenizer through ``rove.train.train``, then perplexity at 1-16x with and without YaRN.

Timing goes through ``harness``: warm-up, interleaved rounds in a rotating order, batches of
calls between CUDA events, medians with interquartile ranges, ratios paired per round. Rows say
their mode (eager or compiled) and timing: "kernel" (CUDA-graph replays: the kernels alone) or
"dispatch" (each call from Python, as a model runs; where the CPU is slower than the kernels,
it times the CPU). The goals (``GOALS``) are stated with the measured value, met / missed /
not measured, and the rows they came from.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import torch
import torch.nn.functional as F

import bench_kernels
import bench_train
import harness
from rove.functional import POS_CHOICES
from rove.kernels import (
    rotate,
    rotate_qkv,
    triton_available,
    unrotate_merge_heads,
    use_backend,
)
from rove.kernels.torch_rotary import rotate_into
from rove.rotary import Rotary
from rove.train.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
# Stage budgets, seconds on one H200 with every compile counted (the device starts bare: no
# Inductor or Triton cache). Estimates until a run measures them; the basis of each:
# - tests 70: the gpu-marked tests in a child on 8 pytest-xdist workers (~56 Triton compiles of
#   ~1-2 s each, 8 at a time, plus 8 interpreters importing torch: ~40 s, PYTEST_SHARE); the
#   float64 checks then, their kernels mostly in Triton's disk cache by then (~25 s).
# - graphs 35 (goal 1): a child process (start-up and CUDA context ~10 s), the launchers from the
#   disk cache, 6 graphs captured and replayed for 15 rounds (~5 s).
# - fused_attention 60 (the fused kernel's goals): its forward and backward kernels compiled cold
#   (a few Triton specialisations of ~5-10 s each) and timed at 3 lengths against RoPE + SDPA.
# - attention 60 (goal 2): eager layers (~10 s), then 6 one-layer compiles of the fused path
#   (~7 s each: Dynamo, AOTAutograd and Inductor on one layer) and their timing.
# - train 220 (goals 3-5): eager steps ~25 s (4 models built, the batch fitted, 18 rounds of 4
#   variants at ~0.1 s); then three cold compiles of the GPT-2 124M step (rope, rove, the
#   minimal reference; forward and backward, 12 blocks), ~45 s each by this estimate: Dynamo's
#   trace ~5 s, AOTAutograd's joint graph and partition ~10 s, Inductor's lowering ~10 s, ~150
#   generated Triton kernels compiled on 16 cores ~20 s (later compiles find some in the disk
#   cache). No 124M compile has been timed on the device: the parts are a reckoning, not
#   readings (the one compile timed here, a tiny model on a 2-core CPU, took 17-23 s, most of it
#   Inductor's C++ build, which CUDA does not use). 3 x 45 s = 135 s, +40 % for the estimate's
#   error = 190 s, then 2 compiled groups of 18 rounds at ~65 ms and peak memory: ~5 s.
# - rotation 25 (no goal reads it): direct launcher, dispatch and torch rows (~5 s), 4 small
#   Inductor compiles of the torch formula (~4 s each).
# - attention_torch 45, pilot 140: opt-in (no goal reads them).
BUDGETS = {"tests": 70, "graphs": 35, "fused_attention": 60, "attention": 60, "train": 220,
           "rotation": 25, "attention_torch": 45, "pilot": 140}  # fmt: skip
# The order of the stages: every goal's timed work first, then what no goal reads, so a run
# short of time (a compile past its estimate, an overrun the watchdog cannot stop) loses rows no
# goal needs before any goal's. The CUDA graphs (goal 1's only rows; a capture that fails half
# way can leave the CUDA context unusable) run in a child process of their own.
STAGES = ("tests", "graphs", "fused_attention", "attention", "train", "rotation",
          "attention_torch", "pilot")  # fmt: skip
FIRST_RUN = ("tests", "graphs", "fused_attention", "attention", "train", "rotation")
TOTAL = 490.0  # the first-run budgets sum to 470 s
PYTEST_SHARE = 0.6  # of the tests stage's budget: the gpu-marked tests; the checks get the rest
PYTEST_WORKERS = 8  # of the device's 16 cores
# The suite's duration, the one statement of it (module docstring, README.md, benchmarks/README.md,
# docs/training.md): the device command's wall time, bounded by `timeout`'s KILL at 550 s.
DURATION = "about 9 minutes (an estimate until a run measures it)"
DEVICE_COMMAND = (  # the documented device call (module docstring, benchmarks/README.md)
    "set -o pipefail; PYTHONPATH=src PYTHONUNBUFFERED=1 timeout -k 20 530 python3 "
    "benchmarks/gpu_suite.py 2>&1 | tee $OUT/gpu_suite.log; s=${PIPESTATUS[0]}; "
    'echo "timeout exit status $s"; exit $s'
)
DRY_BUDGETS = dict.fromkeys(BUDGETS, 60)
H200_PEAK_FLOPS = 989e12  # dense bf16 tensor-core peak of an H200 (SXM), FLOP/s
FUSED_SEQS = (1024, 4096, 16384)  # the fused kernel's lengths (the goal reads T >= 1024)
GOALS = {
    "copy": 0.70,  # fused rotation >= 70 % of copy bandwidth
    "extra": 0.10,  # RoVE extra <= 10 % of an SDPA forward at T = 1024
    "eager": 1.02,  # 124M step rove / rope, eager
    "compiled": 1.005,  # 124M step rove / rope, compiled
    "reference": 1.0,  # compiled rope step / compiled minimal reference
    "fused": 1.02,  # fused RoVE attention / RoPE + SDPA, fwd+bwd, T >= 1024
    "fused step": 1.005,  # 124M compiled step rove / rope with the fused kernel
}
GOAL_TEXTS = {  # every goal, under the stage that measures it
    "graphs": ("fused rotation >= 70% of copy bandwidth (slowest op; kernel rows: CUDA graph)",),
    "fused_attention": (
        "fused RoVE attention <= 1.02x RoPE SDPA fwd+bwd at T >= 1024",
        "124M compiled step rove/rope <= 1.005 (fused kernel)",
    ),
    "attention": tuple(
        f"RoVE extra <= 10% of an SDPA {p} at T=1024 (best fused layer)"
        for p in ("forward (as asked)", "forward + backward")
    ),
    "train": (
        "124M step rove/rope <= 1.02 eager",
        "124M step rove/rope <= 1.005 compiled",
        "compiled rope step / compiled minimal reference <= 1",
    ),
}
# the train stage's groups, each timed on its own: (mode, variants, share of the time left).
# Compiled, only what the goals compare, the reference last (its goal's rows are still ahead of
# every row no goal reads: those stages run after this one).
TRAIN_GROUPS = (
    ("eager", bench_train.VARIANTS, 1 / 3),
    ("compiled", ("rope", "rove"), 1 / 2),
    ("compiled", ("rope", "reference"), 0.8),
)
Variants = dict[str, Callable[[], object]]
OPS = ("split fwd", "merge (split bwd)", "un-rotate fwd", "un-rotate bwd")  # the rotation passes
FAULT_ENV = "ROVE_GPU_SUITE_FAULT"  # test hook: faults injected on purpose (``Suite.fault``)


class Skip(Exception):
    """A stage (or part of one) cannot run here; the message says why."""


class OverBudget(BaseException):
    """Raised by the watchdog inside a stage (a BaseException, so that no library's
    ``except Exception`` swallows it, as a compiler falling back would)."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM: record what there is, write the results, stop."""


@contextlib.contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Raise ``OverBudget`` in the main thread after ``seconds`` of wall-clock time (SIGALRM:
    it lands at the next Python bytecode, also inside a compile or a warm-up)."""

    def fire(signum: int, frame: FrameType | None) -> None:
        raise OverBudget(f"stopped by the watchdog after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclasses.dataclass
class Sizes:
    """Problem sizes: the real ones on a GPU, tiny ones for ``--dry-run``."""

    rot_seq: int = 1024
    rot_min_tokens: int = 32768  # B * T of the rotation tensors, raised to >= 4x the L2
    heads: int = 12
    head_dim: int = 64
    seqs: tuple[int, ...] = (1024,)
    layer_tokens: int = 16384  # B * T of the attention layer at every length
    train_preset: str = "gpt2-124m"
    train_batch: int = 32
    train_seq: int = 1024
    warmup: int = 3
    rounds: int = 15
    graph_calls: int = 20  # launcher calls per CUDA graph
    check_seq: int = 1000  # not a multiple of any tile: the masked tail is checked
    check_heads: int = 10
    pilot_preset: str = "tiny"
    pilot_steps: int = 1500
    pilot_multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    pilot_eval_tokens: int = 32768
    compile_backend: str = "inductor"


DRY = Sizes(
    rot_seq=32,
    rot_min_tokens=256,
    heads=2,
    head_dim=16,
    seqs=(32, 64),
    layer_tokens=64,
    train_preset="nano",
    train_batch=2,
    train_seq=32,
    warmup=1,
    rounds=3,
    graph_calls=2,
    check_seq=10,
    check_heads=10,
    pilot_preset="nano",
    pilot_steps=4,
    pilot_multiples=(1, 2),
    pilot_eval_tokens=512,
    compile_backend="eager",  # dynamo's tracing runs, inductor's C++ build does not (speed)
)


@dataclasses.dataclass(frozen=True)
class CheckCase:
    """One configuration of the rotation ops checked against float64."""

    name: str
    n_head: int
    n_kv_head: int
    rotate_v: bool
    shared_kv: bool = False
    partial: bool = False  # rotate half the channels, pass the rest
    convention: str = "half"
    per_sequence: bool = False


def check_cases(heads: int) -> list[CheckCase]:
    """RoPE and RoVE, GQA, shared KV, partial and interleaved rotary, per-sequence tables."""
    kv = 2 if heads % 2 == 0 else 1
    return [
        CheckCase("rope", heads, heads, rotate_v=False),
        CheckCase("rove", heads, heads, rotate_v=True),
        CheckCase("rope gqa", heads, kv, rotate_v=False),
        CheckCase("rove gqa per-seq", heads, kv, rotate_v=True, per_sequence=True),
        CheckCase("rope shared-kv", heads, kv, rotate_v=False, shared_kv=True),
        CheckCase("rove shared-kv", heads, kv, rotate_v=True, shared_kv=True),
        CheckCase("rove partial", heads, heads, rotate_v=True, partial=True),
        CheckCase("rove interleaved", heads, heads, rotate_v=True, convention="interleaved"),
        CheckCase(
            "rope interleaved per-seq",
            heads,
            kv,
            rotate_v=False,
            convention="interleaved",
            per_sequence=True,
        ),
    ]


def reference_rotation(x: torch.Tensor, angles: torch.Tensor, convention: str) -> torch.Tensor:
    """Float64 rotation from the angles alone (no table, no kernel of rove's): each plane of
    channels is multiplied as a complex number by ``exp(i * angle)``."""
    half = angles.shape[-1]
    x = x.double()
    if convention == "half":
        a, b = x[..., :half], x[..., half : 2 * half]
    else:
        a, b = x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]
    z = torch.complex(a, b) * torch.polar(torch.ones_like(angles), angles)
    out = x.clone()
    if convention == "half":
        out[..., :half], out[..., half : 2 * half] = z.real, z.imag
    else:
        out[..., 0 : 2 * half : 2], out[..., 1 : 2 * half : 2] = z.real, z.imag
    return out


class Suite:
    """Runs the stages, keeps every result and skip, and writes the report after each."""

    def __init__(self, args: argparse.Namespace, clock: Callable[[], float] = time.monotonic):
        self.args = args
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.sizes = dataclasses.replace(DRY if args.dry_run else Sizes())
        if args.seqs:
            self.sizes.seqs = tuple(args.seqs)
        self.dtype = "bf16" if self.cuda else "fp32"
        self.budgets = {**(DRY_BUDGETS if args.dry_run else BUDGETS), **args.budget}
        self.results: dict[str, dict] = {}
        self.markdown: list[str] = []
        self.partial: dict = {}  # what the stage in flight has measured so far
        self.current: str | None = None  # the stage in flight
        self.faults_fired: set[str] = set()  # ``fault``'s test hook: each fault fires once
        json_dir = args.json.parent if args.json is not None else Path(tempfile.gettempdir())
        self.tests_log = json_dir / "gpu_tests.log"  # the gpu-marked tests' output
        self.clock = clock
        self.started = clock()
        # Each layer/model instance and length is its own graph: keep dynamo from falling
        # back to eager after its default 8 recompilations of one function.
        for knob in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 256)

    # ---------------------------------------------------------------- running stages
    def run(self, name: str, fn: Callable[[float], tuple[dict, str]]) -> None:
        """Run stage ``name`` under its watchdog; record its result, skip reason or error."""
        if name not in self.args.stages:
            return
        left = self.args.total - (self.clock() - self.started)
        budget = min(self.budgets[name], left)
        if budget <= 0:
            print(f"\n== {name}: skipped, the suite's total budget is spent", flush=True)
            self.results[name] = {"status": "skipped", "reason": "total budget spent"}
            self.markdown.append(f"### {name}: skipped (the suite's total budget is spent)")
            self.save()
            return
        print(f"\n== {name} (budget {budget:.0f} s)", flush=True)
        started, self.partial, self.current = self.clock(), {}, name
        self.save()  # the stage "in progress" on disk from its start (a KILL keeps that)
        interrupted = None
        try:
            with watchdog(budget):
                result, text = fn(budget)
                self.fault(name)  # a stage with no timed group: the hook fires at its end
            status = "ok"
        except OverBudget as why:
            result, status = {"reason": str(why), **self.partial}, "over budget"
            text = f"Over budget ({why}); what it had:\n\n{self.partial_text()}"
            torch._dynamo.reset()  # a compile may have been cut in the middle
        except Interrupted as why:
            result, status, interrupted = {"reason": str(why), **self.partial}, "interrupted", why
            text = f"Interrupted ({why}); what it had:\n\n{self.partial_text()}"
        except Skip as why:
            result, text, status = {"reason": str(why)}, f"Skipped: {why}", "skipped"
        except torch.cuda.OutOfMemoryError as err:
            result, text, status = {"reason": str(err)}, f"Skipped, out of memory: {err}", "skipped"
        except Exception as err:  # a broken stage must not hide the others' results
            traceback.print_exc()
            result = {"error": f"{type(err).__name__}: {err}", **self.partial}
            text, status = f"**Error**: `{type(err).__name__}: {err}`", "error"
        finally:
            if self.cuda:
                torch.cuda.empty_cache()
        seconds = self.clock() - started
        print(f"{text}\n-- {name}: {status} in {seconds:.0f} s", flush=True)
        self.results[name] = {"status": status, "seconds": seconds, "budget_s": budget, **result}
        self.current = None
        self.markdown.append(f"### {name}: {status}, {seconds:.0f} s\n\n{text}")
        self.save()
        if interrupted is not None:
            raise interrupted

    def group_done(self, goals: list[dict]) -> None:
        """A group of the stage in flight is timed: its goals join what the stage keeps if cut
        short, and the results on disk show them at once (also through a SIGKILL)."""
        self.partial["goals"] = goals
        self.save()
        if self.current is not None:
            self.fault(self.current)

    def fault(self, stage: str) -> None:
        """Test hook: ``ROVE_GPU_SUITE_FAULT=STAGE:WHAT[,...]`` makes stage STAGE, once, after
        its first timed group is saved (or at its end, if it has none), send this process
        SIGTERM (``term``, as ``timeout`` does), SIGKILL itself (``kill``, as ``timeout -k``
        does) or raise an error (``error``). ``capture:error`` / ``capture:crash`` break the
        CUDA-graph capture instead (``capture_graph``)."""
        for item in os.environ.get(FAULT_ENV, "").split(","):
            where, _, what = item.partition(":")
            if where != stage or item in self.faults_fired:
                continue
            self.faults_fired.add(item)
            print(f"\n[{FAULT_ENV}] {what} in stage {stage}", flush=True)
            if what == "term":
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises Interrupted at the next bytecode
            elif what == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif what == "error":
                raise RuntimeError(f"{FAULT_ENV}: injected error in stage {stage}")

    def partial_text(self) -> str:
        return "```\n" + json.dumps(self.partial, indent=1, default=str)[:4000] + "\n```"

    def time(self, variants: Variants, budget: float) -> dict[str, harness.Timing]:
        """Time one group of variants; its rounds stop at ``budget`` (the watchdog is the
        hard stop, this the soft one that keeps the rounds paired)."""
        s = self.sizes
        return harness.time_interleaved(
            variants,
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

    def elapsed(self, since: float) -> float:
        return self.clock() - since

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
            result["pytest"] = self.run_pytest(PYTEST_SHARE * budget)
            lines.append(f"gpu-marked tests: {result['pytest']}")
        self.partial["pytest"] = result["pytest"]
        checks = self.kernel_checks()
        result["kernel_checks"] = checks
        failed = [c for c in checks if not c["ok"]]
        lines += [
            "",
            f"T={self.sizes.check_seq}, {self.sizes.check_heads} query heads of "
            f"{self.sizes.head_dim}; rel. error ||out - ref|| / ||ref|| vs float64",
            "",
            "| op | case | backend | dtype | fwd | grad | tolerance | ok |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for c in checks:
            lines.append(
                f"| {c['op']} | {c['case']} | {c['backend']} | {c['dtype']} | {c['fwd']:.2e} | "
                f"{c['grad']:.2e} | {c['tol']:.0e} | {'yes' if c['ok'] else '**NO**'} |"
            )
        if failed:
            lines.append(f"\n**{len(failed)} kernel check(s) failed.**")
        return result, "\n".join(lines)

    def run_pytest(self, timeout: float) -> str:
        """The ``gpu``-marked tests in a child process; one line of outcome. The child writes
        straight into ``tests_log`` (beside the JSON: under ``$OUT`` on the device), so its
        output is kept whatever happens; it has its own process group, which is killed when
        it runs past ``timeout`` or this suite stops (watchdog, signal). With pytest-xdist
        (on the device image), ``PYTEST_WORKERS`` compile the tests' Triton kernels side by
        side."""
        files = [str(f) for f in sorted((ROOT / "tests").glob("test_*.py"))
                 if "mark.gpu" in f.read_text(encoding="utf-8")]  # fmt: skip
        workers = ["-n", str(PYTEST_WORKERS)] if importlib.util.find_spec("xdist") else []
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
               *workers, "--continue-on-collection-errors", *files]  # fmt: skip
        log = self.tests_log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w", encoding="utf-8") as out:
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # each line on disk as it is written
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # fmt: skip
            try:
                code: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        tail = lines[-1] if lines else "no output"
        if code is None:
            return f"timed out after {timeout:.0f} s (its output: {log}; last line: {tail})"
        if code not in (0, 5):  # 5: nothing collected
            print("\n".join(lines[-60:]))
        return f"exit {code}, {tail}"

    def check_inputs(self, case: CheckCase) -> dict[str, torch.Tensor]:
        """Float64 CPU inputs of a case: the projection, an attention output, and the angles
        of RoPE's textbook frequencies ``10000^(-2i/r)`` (not rove's tables)."""
        s = self.sizes
        gen = torch.Generator().manual_seed(0)
        batch, seq, hd = 2, s.check_seq, s.head_dim
        n_total = case.n_head + (1 if case.shared_kv else 2) * case.n_kv_head
        rotary_dim = hd // 2 if case.partial else hd
        positions = torch.arange(seq) + (torch.tensor([[0], [70000]]) if case.per_sequence else 0)
        inv_freq = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
        return {
            "qkv": torch.randn(batch, seq, n_total * hd, generator=gen, dtype=torch.float64),
            "o": torch.randn(batch, case.n_head, seq, hd, generator=gen, dtype=torch.float64),
            "angles": positions.double()[..., None] * inv_freq,
            "positions": positions,
            "rotary_dim": torch.tensor(rotary_dim),
        }

    def check_outputs(
        self, op: str, case: CheckCase, inputs: dict, dtype: torch.dtype, backend: str
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Outputs of ``op`` on the device and the gradient of a weighted sum of them (the
        weights, made on the device, differ per channel so a wrong plane shows)."""
        rot = Rotary(self.sizes.head_dim, int(inputs["rotary_dim"]), convention=case.convention)
        cos, sin = rot.tables(inputs["positions"].to(self.device))
        src = inputs["qkv" if op == "rotate_qkv" else "o"].to(self.device, dtype)
        src = src.detach().requires_grad_(True)
        with use_backend(backend):
            if op == "rotate_qkv":
                kw = dict(n_head=case.n_head, n_kv_head=case.n_kv_head, rotate_v=case.rotate_v,
                          shared_kv=case.shared_kv, convention=case.convention)  # fmt: skip
                outs = list(rotate_qkv(src, cos, sin, **kw))
            elif op == "unrotate":
                outs = [unrotate_merge_heads(src, cos, sin, convention=case.convention)]
            else:
                outs = [rotate(src, cos, sin, convention=case.convention)]
        w = torch.linspace(-1, 2, self.sizes.head_dim, device=self.device, dtype=torch.float64)
        loss = sum((t.double().unflatten(-1, (-1, self.sizes.head_dim)) * w).sum() for t in outs)
        (grad,) = torch.autograd.grad(loss, src)
        return outs, grad

    def check_reference(
        self, op: str, case: CheckCase, inputs: dict
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The same outputs and gradient from ``reference_rotation`` in float64 on the CPU:
        the split by head slicing, the gradient by autograd through the complex products."""
        hd, conv = self.sizes.head_dim, case.convention
        angles = inputs["angles"]
        ang = angles[:, None] if angles.ndim == 3 else angles  # (B, 1, T, r/2) or (T, r/2)
        src = inputs["qkv" if op == "rotate_qkv" else "o"].clone().requires_grad_(True)
        if op == "rotate_qkv":
            heads = src.unflatten(-1, (-1, hd)).transpose(1, 2)  # (B, H_total, T, D)
            nq, nk = case.n_head, case.n_kv_head
            q = reference_rotation(heads[:, :nq], ang, conv)
            k = reference_rotation(heads[:, nq : nq + nk], ang, conv)
            if case.shared_kv:
                v = k if case.rotate_v else heads[:, nq:]
            else:
                v = heads[:, nq + nk :]
                v = reference_rotation(v, ang, conv) if case.rotate_v else v
            outs = [q, k, v]
        elif op == "unrotate":
            outs = [reference_rotation(src, -ang, conv).transpose(1, 2).flatten(2)]
        else:
            outs = [reference_rotation(src, ang, conv)]
        w = torch.linspace(-1, 2, hd, dtype=torch.float64)
        loss = sum((t.unflatten(-1, (-1, hd)) * w).sum() for t in outs)
        (grad,) = torch.autograd.grad(loss, src)
        return [t.detach() for t in outs], grad

    def kernel_checks(self) -> list[dict]:
        """Every op, case, backend and dtype against ``check_reference``."""
        rows = []
        tols = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
        dtypes = [torch.float32, torch.bfloat16] if self.cuda else [torch.float32]
        for case in check_cases(self.sizes.check_heads):
            inputs = self.check_inputs(case)
            ops = ["rotate_qkv", "unrotate"]
            ops += ["rotate"] if case.name == "rove" else []
            for op in ops:
                ref_outs, ref_grad = self.check_reference(op, case, inputs)
                ref = torch.cat([t.flatten() for t in ref_outs])
                for backend in self.backends():
                    for dtype in dtypes:
                        outs, grad = self.check_outputs(op, case, inputs, dtype, backend)
                        out = torch.cat([t.double().flatten().cpu() for t in outs])
                        fwd = ((out - ref).norm() / ref.norm()).item()
                        g = ((grad.double().cpu() - ref_grad).norm() / ref_grad.norm()).item()
                        ok = math.isfinite(fwd) and math.isfinite(g) and max(fwd, g) <= tols[dtype]
                        rows.append(dict(op=op, case=case.name, backend=backend,
                                         dtype=str(dtype).removeprefix("torch."), fwd=fwd,
                                         grad=g, tol=tols[dtype], ok=bool(ok)))  # fmt: skip
                        self.partial["kernel_checks"] = rows
        return rows

    # ---------------------------------------------------------------- (b) rotation bandwidth
    def rotation_tensors(self) -> dict[str, torch.Tensor]:
        """bf16 (fp32 on CPU) qkv ``(B, T, 3 H D)`` and o ``(B, H, T, D)`` of at least 4x the
        L2 each (so every call streams from memory), tables, and preallocated outputs."""
        s, dtype = self.sizes, bench_kernels.DTYPES[self.dtype]
        tokens = s.rot_min_tokens
        if self.cuda and not self.args.dry_run:
            l2 = torch.cuda.get_device_properties(self.device).L2_cache_size
            per_token = s.heads * s.head_dim * torch.finfo(dtype).bits // 8  # o, the smaller
            tokens = max(tokens, math.ceil(4 * l2 / per_token))
        bsz, seq, h, hd = math.ceil(tokens / s.rot_seq), s.rot_seq, s.heads, s.head_dim
        dev = self.device
        cos, sin = Rotary(hd).tables(torch.arange(seq, device=dev))
        return {
            "qkv": torch.randn(bsz, seq, 3 * h * hd, device=dev, dtype=dtype),
            "o": torch.randn(bsz, seq, h, hd, device=dev, dtype=dtype).transpose(1, 2),
            "rot": torch.empty(bsz, seq, 3 * h, hd, device=dev, dtype=dtype).transpose(1, 2),
            "q": torch.empty(bsz, seq, h, hd, device=dev, dtype=dtype).transpose(1, 2),
            "k": torch.empty(bsz, seq, h, hd, device=dev, dtype=dtype).transpose(1, 2),
            "v": torch.empty(bsz, seq, h, hd, device=dev, dtype=dtype).transpose(1, 2),
            "dqkv": torch.empty(bsz, seq, 3 * h * hd, device=dev, dtype=dtype),
            "y": torch.empty(bsz, seq, h * hd, device=dev, dtype=dtype),
            "do": torch.empty(bsz, seq, h, hd, device=dev, dtype=dtype).transpose(1, 2),
            "cos": cos,
            "sin": sin,
        }

    def rotation_variants(self, t: dict[str, torch.Tensor], compiled: bool) -> dict[str, Variants]:
        """Groups of calls, each timed on its own, every call from Python (rows "dispatch"):
        "triton launcher" (the launchers into preallocated outputs, no autograd), "triton
        dispatch" (the public ops with autograd, as a model calls them), "torch eager" /
        "torch compiled" (the formula into the same outputs; compiled by Inductor when
        ``compiled``, alone in its group). The kernels alone: ``stage_graphs``."""

        def formula(out: torch.Tensor, x: torch.Tensor, conjugate: bool) -> torch.Tensor:
            return rotate_into(out, x, t["cos"], t["sin"], inverse=conjugate)

        if compiled:
            fn = torch.compile(formula, backend=self.sizes.compile_backend, fullgraph=True)
            return {"torch compiled": self.formula_calls(fn, t)}
        groups = {}
        if "triton" in self.backends():
            groups["triton launcher"] = self.launcher_calls(t)
            groups["triton dispatch"] = self.dispatch_calls("triton", t)
        groups["torch eager"] = self.formula_calls(formula, t)
        return groups

    def launcher_calls(self, t: dict[str, torch.Tensor]) -> Variants:
        """The four passes through the Triton launchers, into preallocated outputs."""
        from rove.kernels.triton_kernels import launch_merge_qkv, launch_rotate, launch_rotate_qkv

        cos, sin, qkv, o = t["cos"], t["sin"], t["qkv"], t["o"]
        kw = dict(rotate_v=True, shared_kv=False, interleaved=False)
        y_heads = t["y"].unflatten(-1, (self.sizes.heads, -1)).transpose(1, 2)
        return {
            "split fwd": lambda: launch_rotate_qkv(qkv, t["q"], t["k"], t["v"], cos, sin, **kw),
            "merge (split bwd)": lambda: launch_merge_qkv(
                t["q"], t["k"], t["v"], t["dqkv"], cos, sin, **kw
            ),
            "un-rotate fwd": lambda: launch_rotate(
                o, t["y"], cos, sin, interleaved=False, conjugate=True
            ),
            "un-rotate bwd": lambda: launch_rotate(
                y_heads, t["do"], cos, sin, interleaved=False, conjugate=False
            ),
        }

    def formula_calls(
        self, fn: Callable[[torch.Tensor, torch.Tensor, bool], object], t: dict[str, torch.Tensor]
    ) -> Variants:
        """The launchers' four passes, each through the torch formula ``fn(out, x, conjugate)``
        into the same preallocated tensors (the same bytes moved)."""
        hd = self.sizes.head_dim
        qkv_heads = t["qkv"].unflatten(-1, (-1, hd)).transpose(1, 2)  # (B, 3H, T, D) views
        dqkv_heads = t["dqkv"].unflatten(-1, (-1, hd)).transpose(1, 2)
        y_heads = t["y"].unflatten(-1, (-1, hd)).transpose(1, 2)
        return {
            "split fwd": lambda: fn(t["rot"], qkv_heads, False),
            "merge (split bwd)": lambda: fn(dqkv_heads, t["rot"], True),
            "un-rotate fwd": lambda: fn(y_heads, t["o"], True),
            "un-rotate bwd": lambda: fn(t["do"], y_heads, False),
        }

    def dispatch_calls(self, backend: str, t: dict[str, torch.Tensor]) -> Variants:
        """The public ops as a model calls them (dispatch, custom op, autograd node)."""
        qkv = t["qkv"].detach().requires_grad_(True)
        o = t["o"].detach().requires_grad_(True)
        calls = bench_kernels.rotation_cases(
            backend, qkv, o, (t["cos"], t["sin"]), self.sizes.heads
        )
        return dict(zip(OPS, calls.values(), strict=True))

    def copy_calls(self, t: dict[str, torch.Tensor]) -> Variants:
        """Copies of the same tensors: the bandwidth every rotation row is paired with."""
        return {
            "copy qkv": lambda: t["dqkv"].copy_(t["qkv"]),
            "copy o": lambda: t["do"].copy_(t["o"]),
        }

    def rotation_bytes(self, t: dict[str, torch.Tensor]) -> tuple[dict[str, int], dict[str, int]]:
        """Bytes a copy of each tensor moves (read + written) and each op moves (tables too)."""
        nbytes = {k: 2 * t[k].numel() * t[k].element_size() for k in ("qkv", "o")}
        table = 2 * t["cos"].numel() * t["cos"].element_size()
        return nbytes, {op: nbytes["qkv" if "split" in op else "o"] + table for op in OPS}

    def bandwidth_rows(
        self, timings: dict[str, harness.Timing], t: dict[str, torch.Tensor], group: str,
        mode: str, calls_per: int = 1, timing: str = "dispatch",
    ) -> list[dict]:  # fmt: skip
        """One row per op of a timed group: its time per call, bandwidth and share of the
        copy's, paired per round with the copy timed in the same rounds the same way."""
        nbytes, moved = self.rotation_bytes(t)
        rows = []
        for op in OPS:
            if op not in timings:
                continue
            size = "qkv" if "split" in op else "o"
            ref, timed = timings[f"copy {size}"], timings[op]
            per_call = timed.median / calls_per
            ratio = harness.paired_ratio(ref, timed)[0] * moved[op] / nbytes[size]
            rows.append(dict(group=group, op=op, mode=mode, timing=timing,
                             us=per_call * 1e6, gbps=moved[op] / per_call / 1e9,
                             copy_gbps=nbytes[size] * calls_per / ref.median / 1e9,
                             of_copy=ratio, rounds=len(timed.samples)))  # fmt: skip
        return rows

    def tensors_line(self, t: dict[str, torch.Tensor]) -> str:
        nbytes, _ = self.rotation_bytes(t)
        return (f"{self.dtype}, qkv {tuple(t['qkv'].shape)} ({nbytes['qkv'] / 2e6:.0f} MB), "
                f"o {tuple(t['o'].shape)} ({nbytes['o'] / 2e6:.0f} MB)")  # fmt: skip

    @staticmethod
    def bandwidth_text(tensors: str, rows: list[dict], how: str) -> str:
        lines = [
            f"{tensors}; GB/s counts bytes read and written; of copy: paired per round with a "
            f"copy of the same tensor timed the same way; {how}",
            "",
            "| group | op | mode | timing | us/call | GB/s | copy GB/s | of copy | rounds |",
            "|---|---|---|---|---:|---:|---:|---:|---:|",
        ]
        lines += [f"| {r['group']} | {r['op']} | {r['mode']} | {r['timing']} | {r['us']:.1f} | "
                  f"{r['gbps']:.0f} | {r['copy_gbps']:.0f} | {r['of_copy']:.0%} | {r['rounds']} |"
                  for r in rows]  # fmt: skip
        return "\n".join(lines)

    # ---------------------------------------------------------------- (b) kernels alone: graphs
    def capture_graph(self, fn: Callable[[], object], calls: int) -> Callable[[], object]:
        """``calls`` calls of ``fn`` in one CUDA graph (``harness.cuda_graph``); on a CPU (the
        dry run) a stand-in that makes the calls from Python. ``fault``'s test hook can make
        the capture raise (``capture:error``) or kill the process (``capture:crash``)."""
        faults = os.environ.get(FAULT_ENV, "").split(",")
        if "capture:error" in faults:
            raise RuntimeError(f"{FAULT_ENV}: injected CUDA-graph capture failure")
        if "capture:crash" in faults:
            os.abort()  # as a capture that takes the process (and its CUDA context) down
        if self.cuda:
            return harness.cuda_graph(fn, calls)
        return lambda: [fn() for _ in range(calls)]

    def stage_graphs(self, budget: float) -> tuple[dict, str]:
        """Goal 1's rows: the Triton launchers (the torch formula where Triton is absent), N
        calls each captured in one CUDA graph and replayed, paired with copies graphed the same
        way: the kernels' own time. In a child process (``run_child``): a capture that fails,
        even one that leaves the CUDA context unusable, costs this stage alone."""
        if not self.args.child:
            return self.run_child("graphs", budget)
        t = self.rotation_tensors()
        if "triton" in self.backends():
            group, calls = "triton launcher", self.launcher_calls(t)
        else:
            group = "torch eager"
            calls = self.formula_calls(
                lambda out, x, conj: rotate_into(out, x, t["cos"], t["sin"], inverse=conj), t
            )
        n = self.sizes.graph_calls
        graphs: Variants = {}
        for name, fn in {**calls, **self.copy_calls(t)}.items():
            try:
                graphs[name] = self.capture_graph(fn, n)
            except Exception as err:  # recorded; the rows of a half-captured group mean nothing
                self.partial["capture_error"] = f"{name}: {type(err).__name__}: {err}"
                raise
        rows: list[dict] = []
        self.partial["rows"] = rows
        timings = self.time(graphs, budget / 2)
        kernel = self.cuda  # a CPU stand-in makes each call from Python
        rows += self.bandwidth_rows(
            timings, t, group + (" (CUDA graph)" if kernel else " (no CUDA graph on CPU)"),
            "eager", calls_per=n, timing="kernel" if kernel else "dispatch",
        )  # fmt: skip
        self.group_done(self.rotation_goals(rows))
        how = (
            f"timing kernel: {n} calls replayed from one CUDA graph, no Python between them"
            if kernel
            else f"no CUDA graph on a CPU: {n} calls from Python (timing dispatch)"
        )
        tensors = self.tensors_line(t)
        result = {"tensors": tensors, "timing_note": how, "rows": rows,
                  "goals": self.rotation_goals(rows)}  # fmt: skip
        return result, self.bandwidth_text(tensors, rows, how)

    def run_child(self, name: str, budget: float) -> tuple[dict, str]:
        """Stage ``name`` in a child process (this script with ``--child``) with its own CUDA
        context; its record is read back from the JSON it writes after every group. The child
        has its own process group, killed when this stage stops (watchdog, signal)."""
        with tempfile.TemporaryDirectory(prefix="rove-gpu-suite-") as tmp:
            path = Path(tmp) / "child.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--stages", name,
                   "--device", str(self.device), "--threads", str(torch.get_num_threads()),
                   "--total", f"{max(budget - 10, 1):.0f}", "--json", str(path),
                   *(["--dry-run"] if self.args.dry_run else []),
                   "--budget", f"{name}={max(budget - 10, 1):.0f}"]  # start-up ~10 s  # fmt: skip
            env = {k: v for k, v in os.environ.items() if k != "OUT"}  # the parent's $OUT files
            env["PYTHONUNBUFFERED"] = "1"  # its log line by line, also when it is killed
            faults = os.environ.get(FAULT_ENV, "").split(",")
            env[FAULT_ENV] = ",".join(f for f in faults if f.startswith("capture:"))
            print(f"{name}: in a child process", flush=True)
            log = Path(tmp) / "child.log"  # not this process's stdout: a pipe the child held
            with log.open("w", encoding="utf-8") as out:  # would keep `tee` waiting for it
                proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
                try:
                    self.fault(name)  # the test hook: this stage stopped while its child runs
                    code: int | None = proc.wait(timeout=max(budget - 2, 1))
                except subprocess.TimeoutExpired:
                    code = None
                finally:
                    if proc.poll() is None:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                    print(log.read_text(encoding="utf-8", errors="replace")[-8000:], flush=True)
            data = json.loads(path.read_text()) if path.exists() else {}
        record = dict(data.get("stages", {}).get(name, {}))
        status = record.pop("status", "no record")
        for key in ("seconds", "budget_s"):
            record.pop(key, None)
        child_error = record.pop("error", None)  # this stage's error names the child's
        how = ("killed: over this stage's budget" if code is None else
               f"exit {code}" + (f" ({signal.Signals(-code).name})" if code < 0 else ""))  # fmt: skip
        self.partial.update(record, child=how)
        if status == "ok" and code == 0:
            note = record.get("timing_note", "")
            text = self.bandwidth_text(record.get("tensors", ""), record.get("rows", []), note)
            return {**record, "child": how}, text
        if status == "skipped":
            raise Skip(record.get("reason", "the child skipped it"))
        if code is None or status == "over budget":
            raise OverBudget(f"the child process ({how}): {record.get('reason', status)}")
        raise RuntimeError(f"the child process ({how}), its stage {status}: "
                           f"{child_error or 'no error recorded'}")  # fmt: skip

    def rotation_goals(self, rows: list[dict]) -> list[dict]:
        """Goal 1 from the kernel rows of the fused launchers: the slowest op's share of copy
        bandwidth (dispatch rows measure the CPU when a call's kernel is shorter than its
        dispatch)."""
        kernel = [r for r in rows if r["timing"] == "kernel" and r["group"].startswith("triton")]
        worst = min((r["of_copy"] for r in kernel), default=None)
        if {r["op"] for r in kernel} != set(OPS):
            worst = None
        why = "no fused Triton on CUDA here" if "triton" not in self.backends() else (
            "its CUDA-graph group did not finish")  # fmt: skip
        (text,) = GOAL_TEXTS["graphs"]
        return [self.goal(text, worst, GOALS["copy"], ">=", "{:.0%}", why=why,
                          rows=[row_name("graphs", r) for r in kernel])]  # fmt: skip

    # ---------------------------------------------------------------- (f) dispatch and torch
    def stage_rotation(self, budget: float) -> tuple[dict, str]:
        """What no goal reads: each pass called from Python (launchers, public ops, the torch
        formula eager and compiled) against copies called the same way."""
        started = self.clock()
        t = self.rotation_tensors()
        rows: list[dict] = []
        self.partial["rows"] = rows
        for compiled in (False, True):
            for group, calls in self.rotation_variants(t, compiled).items():
                left = budget - self.elapsed(started)
                # the copies run in every group's rounds: each ratio pairs with its own round
                timings = self.time({**calls, **self.copy_calls(t)}, left / 4)
                mode = "compiled" if compiled else "eager"
                rows += self.bandwidth_rows(timings, t, group, mode)
                self.group_done([])
        how = ("timing dispatch: each call from Python (launcher, op dispatch; wrap_triton's "
               "alone is ~1 ms of CPU); the kernels alone: the graphs stage")  # fmt: skip
        tensors = self.tensors_line(t)
        return {"tensors": tensors, "rows": rows}, self.bandwidth_text(tensors, rows, how)

    # ---------------------------------------------------------------- (c) fused attention
    def stage_fused_attention(self, budget: float) -> tuple[dict, str]:
        """The fused RoVE attention kernel against RoPE + SDPA (flash), through
        ``bench_attention.fused_attention_rows`` (the kernel's own benchmark; where it does not
        exist yet, one "not built" row and its goals not measured). The contract:

        ``fused_attention_rows(device=, dtype=, seqs=, heads=, head_dim=, tokens=, time=,
        budget_s=, add_rows=)`` times the fused kernel and RoPE + SDPA at each length of
        ``seqs`` (B = max(1, tokens // T)), through ``time(variants, budget_s)`` (the suite's
        paired, interleaved harness), and hands its rows to ``add_rows(rows)`` after each timed
        group (so a stage cut short keeps them; rows it returns instead are added at the end).
        A row: ``seq``, ``pass`` ("fwd" | "fwd+bwd"), ``mode`` ("eager" | "compiled"),
        ``timing`` ("kernel": CUDA graph | "dispatch": each call from Python), ``fused_ms``,
        ``rope_sdpa_ms``, ``ratio`` (fused / RoPE + SDPA, paired per round), and ``batch``,
        ``heads``, ``head_dim``, ``causal`` (or ``flops`` itself) for the kernel's FLOP/s
        against the H200's peak (``H200_PEAK_FLOPS``), which this stage adds. Where it cannot
        time the kernel (a CPU: the dry run), it raises ``NotImplementedError(why)``: the stage
        is skipped with that reason (or it runs the dry run's tiny sizes)."""
        import bench_attention

        rows: list[dict] = []
        self.partial.update(rows=rows)
        fn = getattr(bench_attention, "fused_attention_rows", None)
        self.partial["built"] = fn is not None
        if fn is None:
            rows.append({"row": "fused RoVE attention", "status": "not built: "
                         "benchmarks/bench_attention.py has no fused_attention_rows"})  # fmt: skip
            goals = self.fused_goals(rows, built=False)
            return {"built": False, "rows": rows, "goals": goals}, (
                "Not built: benchmarks/bench_attention.py has no `fused_attention_rows` (the "
                "fused kernel's rows and goals land here once it does)")  # fmt: skip

        def add_rows(new: list[dict]) -> None:
            rows.extend(fused_row(r) for r in new)
            self.group_done(self.fused_goals(rows, built=True))

        dtype = bench_kernels.DTYPES[self.dtype]
        s = self.sizes
        seqs = FUSED_SEQS if self.cuda and not self.args.dry_run else s.seqs
        try:
            returned = fn(device=self.device, dtype=dtype, seqs=seqs, heads=s.heads,
                          head_dim=s.head_dim, tokens=s.layer_tokens, time=self.time,
                          budget_s=budget, add_rows=add_rows)  # fmt: skip
        except NotImplementedError as why:  # the contract's "cannot time it here" (a CPU)
            raise Skip(f"fused_attention_rows: {why}") from None
        if returned and not rows:
            add_rows(list(returned))
        lines = [
            f"{self.dtype}, B*T = {s.layer_tokens}, {s.heads} heads of {s.head_dim}; "
            f"fused / RoPE + SDPA paired per round; TFLOP/s of the fused kernel, of the H200's "
            f"{H200_PEAK_FLOPS / 1e12:.0f} TFLOP/s dense bf16 peak",
            "",
            "| T | pass | mode | timing | fused ms | RoPE+SDPA ms | fused / RoPE+SDPA "
            "| TFLOP/s | of peak |",
            "|---:|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r.get('seq')} | {r.get('pass')} | {r.get('mode')} | {r.get('timing')} | "
                f"{_fmt(r.get('fused_ms'), '{:.3f}')} | {_fmt(r.get('rope_sdpa_ms'), '{:.3f}')} | "
                f"{_fmt(r.get('ratio'), '{:.3f}')} | {_fmt(r.get('tflops'), '{:.0f}')} | "
                f"{_fmt(r.get('of_peak'), '{:.0%}')} |"
            )
        goals = self.fused_goals(rows, built=True)
        return {"built": True, "rows": rows, "goals": goals}, "\n".join(lines)

    def fused_goals(self, rows: list[dict], built: bool) -> list[dict]:
        """The fused kernel's goals: its worst length at T >= 1024 (each length's best mode)
        fwd+bwd against RoPE + SDPA; the 124M compiled step is the train stage's (``goals``
        fills it in once that stage has measured it)."""
        text, step_text = GOAL_TEXTS["fused_attention"]
        best: dict[int, dict] = {}
        timed = [
            r
            for r in rows
            if r.get("pass") == "fwd+bwd" and (r.get("seq") or 0) >= 1024 and r.get("ratio")
        ]
        for r in sorted(timed, key=lambda r: -r["ratio"]):  # each length's best mode last
            best[r["seq"]] = r
        worst = max(best.values(), key=lambda r: r["ratio"], default=None)
        why = "no fwd+bwd row at T >= 1024" if built else "fused kernel not built"
        return [
            self.goal(text, None if worst is None else worst["ratio"], GOALS["fused"], "<=",
                      "{:.3f}", why=why,
                      rows=[row_name("fused_attention", r) for r in best.values()]),
            self.goal(step_text, None, GOALS["fused step"], "<=", "{:.3f}",
                      why="the train stage measures it" if built else "fused kernel not built"),
        ]  # fmt: skip

    # ---------------------------------------------------------------- (d) attention layer
    def attention_variants(self, seq: int, compiled: bool, backends: list[str]) -> Variants:
        """SDPA alone and one layer per backend and pos, forward (no grad) and fwd+bwd."""
        s, dtype = self.sizes, bench_kernels.DTYPES[self.dtype]
        bsz = max(1, s.layer_tokens // seq)
        q, k, v = (torch.randn(bsz, s.heads, seq, s.head_dim, device=self.device, dtype=dtype,
                               requires_grad=True) for _ in range(3))  # fmt: skip
        g = torch.randn_like(q)

        def sdpa_fwd() -> object:
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        variants: Variants = {
            "sdpa fwd": sdpa_fwd,
            "sdpa fwd+bwd": lambda: torch.autograd.grad(
                F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), g
            ),
        }
        args = argparse.Namespace(
            dtype=self.dtype,
            heads=s.heads,
            head_dim=s.head_dim,
            device=self.device,
            compile_backend=s.compile_backend,
        )
        for backend in backends:
            for pos in POS_CHOICES:
                fwd_bwd, fwd = bench_kernels.layer_step(pos, backend, compiled, seq, bsz, args)
                variants[f"{backend} {pos} fwd"] = fwd
                variants[f"{backend} {pos} fwd+bwd"] = fwd_bwd
        return variants

    def stage_attention(self, budget: float) -> tuple[dict, str]:
        """Goal 2's rows: eager layers (every backend), then the fused path compiled."""
        fused_first = sorted(self.backends(), key=lambda b: b != "triton")
        compiled = [(True, ["triton"])] if "triton" in fused_first else []
        rows = self.attention_groups(budget, [(False, fused_first), *compiled])
        return {"rows": rows, "goals": self.attention_goals(rows)}, self.attention_text(rows)

    def stage_attention_torch(self, budget: float) -> tuple[dict, str]:
        """The torch path's layers compiled by Inductor (no goal reads them)."""
        rows = self.attention_groups(budget, [(True, ["torch"])])
        return {"rows": rows}, self.attention_text(rows)

    def attention_groups(self, budget: float, groups: list[tuple[bool, list[str]]]) -> list[dict]:
        """Time each (compiled, backends) group at every length on its own: a group's compiles
        all happen in its warm-up, so a group cut short by the watchdog leaves those before it
        whole."""
        rows: list[dict] = []
        self.partial["rows"] = rows
        started = self.clock()
        for compiled, backends in groups:
            for seq in self.sizes.seqs:
                left = budget - self.elapsed(started)
                variants = self.attention_variants(seq, compiled, backends)
                timings = self.time(variants, left / 3)
                for backend in backends:
                    for p in ("fwd", "fwd+bwd"):
                        rows.append(self.attention_row(timings, seq, backend, compiled, p))
                del variants  # free this length's layers before the next
                self.group_done(self.attention_goals(rows))
        return rows

    def attention_text(self, rows: list[dict]) -> str:
        lines = [
            f"{self.dtype}, B*T = {self.sizes.layer_tokens}, {self.sizes.heads} heads of "
            f"{self.sizes.head_dim}; fwd under no_grad; RoVE extra = (rove - rope) / SDPA of "
            "the same pass, paired per round (SDPA runs in every group); timing dispatch: each "
            "call from Python, as a model runs it (CUDA events around a batch of calls: where "
            "the CPU is slower than the kernels, it times the CPU)",
            "",
            "| T | backend | mode | timing | pass | SDPA ms | nope ms | rope ms | rove ms "
            "| rove / rope [IQR] | RoVE extra / SDPA [IQR] |",
            "|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lo, hi = r["rove_over_rope_q1_q3"]
            elo, ehi = r["extra_q1_q3"]
            lines.append(
                f"| {r['seq']} | {r['backend']} | {r['mode']} | {r['timing']} | {r['pass']} | "
                f"{r['sdpa_ms']:.3f} | {r['nope_ms']:.3f} | {r['rope_ms']:.3f} | "
                f"{r['rove_ms']:.3f} | {r['rove_over_rope']:.3f} [{lo:.3f}-{hi:.3f}] | "
                f"{r['extra']:.1%} [{elo:.1%}-{ehi:.1%}] |"
            )
        return "\n".join(lines)

    def attention_goals(self, rows: list[dict]) -> list[dict]:
        """RoVE's extra over RoPE as a share of SDPA at T = 1024, per pass: the best fused
        (Triton) layer, eager or compiled, else the best torch one where Triton is absent. The
        goal names the row it came from (its mode and timing)."""
        goals = []
        for p, text in zip(("fwd", "fwd+bwd"), GOAL_TEXTS["attention"], strict=True):
            at_1k = [r for r in rows if r["seq"] == 1024 and r["pass"] == p]
            fused = [r for r in at_1k if r["backend"] == "triton"] or at_1k
            best = min(fused, key=lambda r: r["extra"], default=None)
            goals.append(self.goal(text, None if best is None else best["extra"], GOALS["extra"],
                                   "<=", "{:.1%}", why="T=1024 not measured",
                                   rows=[] if best is None else [row_name("attention", best)]))  # fmt: skip
        return goals

    def attention_row(
        self, timings: dict[str, harness.Timing], seq: int, backend: str, compiled: bool, p: str
    ) -> dict:
        """One table row: a backend, mode and pass at one length, ratios paired per round."""
        t = {m: timings[f"{backend} {m} {p}"] for m in POS_CHOICES}
        sd = timings[f"sdpa {p}"]
        ratio = harness.paired_ratio(t["rove"], t["rope"])
        extra = [(a - b) / c for a, b, c in
                 zip(t["rove"].samples, t["rope"].samples, sd.samples, strict=False)]  # fmt: skip
        row = dict(seq=seq, backend=backend, compiled=compiled, sdpa_ms=sd.median * 1e3)
        row.update(mode="compiled" if compiled else "eager", timing="dispatch")
        row["pass"] = p
        row.update({f"{m}_ms": t[m].median * 1e3 for m in POS_CHOICES})
        row.update(rove_over_rope=ratio[0], rove_over_rope_q1_q3=list(ratio[1:]))
        row.update(extra=sorted(extra)[len(extra) // 2], extra_q1_q3=list(harness.quartiles(extra)))
        return row

    # ---------------------------------------------------------------- (e) training step
    def train_config(self) -> TrainConfig:
        s = self.sizes
        return TrainConfig(preset=s.train_preset, seq_len=s.train_seq, compile=False).resolve()

    def train_variants(self, cfg: TrainConfig, compiled: bool) -> Variants:
        """Every variant eager; compiled, those the goals compare (each cold compile costs
        ~40 s on the device: nope's would not fit the budget)."""
        mode = "compiled" if compiled else "eager"
        names = ("rope", "rove", "reference") if compiled else bench_train.VARIANTS
        return {
            f"{name} {mode}": bench_train.make_variant(
                name,
                dataclasses.replace(cfg, compile=compiled),
                self.device,
                dtype="bf16",
                compile_backend=self.sizes.compile_backend,
            )
            for name in names
        }

    def stage_train(self, budget: float) -> tuple[dict, str]:
        s = self.sizes
        started = self.clock()
        base = self.train_config()
        batch = self.fit_batch(base, s.train_batch)
        cfg = dataclasses.replace(base, micro_batch=batch, tokens_per_step=batch * s.train_seq)
        rows: dict[str, dict] = {}
        ratios: dict[str, float] = {}  # the goals' paired ratios, as their groups finish
        self.partial.update(batch=batch, rows=rows, ratios=ratios)
        timings: dict[str, harness.Timing] = {}
        steps = self.train_variants(cfg, compiled=False)
        for mode, names, share in TRAIN_GROUPS:
            if f"rope {mode}" not in steps:  # the compiled steps, built once for both groups
                steps.clear()  # free the eager models first
                steps.update(self.train_variants(cfg, compiled=True))
            variants = {f"{n} {mode}": steps[f"{n} {mode}"] for n in names}
            group = self.time(variants, share * (budget - self.elapsed(started)))
            rope = group[f"rope {mode}"]
            for key, t in group.items():
                if key not in rows:  # rope compiled, timed again beside the reference
                    peak = harness.peak_memory_bytes(steps[key], self.device)
                    over = harness.paired_ratio(t, rope)
                    rows[key] = {**t.to_dict(), "mode": mode, "timing": "dispatch",
                                 "over_rope": over, "peak_bytes": peak}  # fmt: skip
                    timings[key] = t
            if "rove" in names:
                ratios[f"rove/rope {mode}"] = rows[f"rove {mode}"]["over_rope"][0]
            if "reference" in names and mode == "compiled":
                reference = group["reference compiled"]
                ratios["rope/reference compiled"] = harness.paired_ratio(rope, reference)[0]
            self.group_done(self.train_goals(ratios, rows))
        del steps
        tokens = batch * s.train_seq
        lines = [
            f"{s.train_preset}, B={batch} x T={s.train_seq}, bf16 autocast, AdamW "
            f"{'fused' if self.cuda else 'foreach'}; groups timed apart: eager, compiled rope "
            "and rove, compiled reference beside rope again; timing dispatch: every step "
            "called from Python, as training runs it",
            "",
            "| variant | mode | timing | ms/step [IQR] | tokens/s | / rope (same group) [IQR] "
            "| peak MB |",
            "|---|---|---|---|---|---|---|",
        ]
        for key, t in timings.items():
            peak = rows[key]["peak_bytes"]
            lines.append(
                f"| {key} | {rows[key]['mode']} | {rows[key]['timing']} | {t.summary()} | "
                f"{tokens / t.median:,.0f} | "
                f"{harness.format_ratio(rows[key]['over_rope'])} | "
                f"{'-' if peak is None else f'{peak / 2**20:.0f}'} |"
            )
        goals = self.train_goals(ratios, rows)
        return {"batch": batch, "rows": rows, "ratios": ratios, "goals": goals}, "\n".join(lines)

    def train_goals(self, ratios: dict[str, float], rows: dict[str, dict]) -> list[dict]:
        """The step-time goals from the paired ratios measured so far (GPT-2 124M only), each
        naming the rows its ratio pairs."""
        real = self.sizes.train_preset == "gpt2-124m"
        keys = ("rove/rope eager", "rove/rope compiled", "rope/reference compiled")
        targets = (GOALS["eager"], GOALS["compiled"], GOALS["reference"])
        return [
            self.goal(text, ratios.get(key) if real else None, target, "<=", "{:.3f}",
                      why=f"{key}: its group did not finish" if real else
                      f"preset {self.sizes.train_preset}, not gpt2-124m",
                      rows=[train_row_name(key.split()[-1], n, rows)
                            for n in key.split()[0].split("/")])
            for text, key, target in zip(GOAL_TEXTS["train"], keys, targets, strict=True)
        ]  # fmt: skip

    def fit_batch(self, cfg: TrainConfig, batch: int) -> int:
        """``batch`` or the largest power-of-two fraction of it whose eager step fits."""
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

    # ---------------------------------------------------------------- (h) pilot
    def stage_pilot(self, budget: float) -> tuple[dict, str]:
        from rove.data import prepare_dataset
        from rove.eval.suite import EvalConfig, evaluate_checkpoint
        from rove.train import train

        s = self.sizes
        with tempfile.TemporaryDirectory(prefix="rove-pilot-") as tmp:
            work = Path(tmp)
            data = prepare_dataset("stdlib", work / "data", "byte", workers=1, progress=False)
            lines = [
                f"preset {s.pilot_preset}, {s.pilot_steps} steps each, byte tokenizer on the "
                "embedded corpus; perplexity on its validation split",
                "",
            ]
            records: dict[str, dict] = {}
            self.partial["records"] = records
            for pos in ("rope", "rove"):
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
                self.group_done([])
            lengths = sorted(records["rope"]["ppl"], key=int)
            lines += ["| pos | scaling | " + " | ".join(f"ppl@{n}" for n in lengths) + " |",
                      "|---|---|" + "---|" * len(lengths)]  # fmt: skip
            for pos, r in records.items():
                for kind, cells in (("none", r["ppl"]), ("yarn", r["ppl_yarn"])):
                    vals = [cells.get(n) for n in lengths]
                    lines.append(f"| {pos} | {kind} | " + " | ".join(
                        "-" if v is None else f"{v:.3g}" for v in vals) + " |")  # fmt: skip
            return {"records": records}, "\n".join(lines)

    # ---------------------------------------------------------------- goals and report
    def goal(self, text: str, value, target: float, op: str, fmt: str, *, why: str,
             rows: list[str] | None = None) -> dict:  # fmt: skip
        """A goal's record: its value and met / missed, or why not measured; ``rows``, the
        rows (stage, name, mode and timing) its value came from."""
        if value is None:
            return {"goal": text, "value": None, "status": f"not measured ({why})",
                    "rows": rows or []}  # fmt: skip
        met = value >= target if op == ">=" else value <= target
        return {"goal": text, "value": value, "status": "met" if met else "missed",
                "shown": fmt.format(value), "rows": rows or []}  # fmt: skip

    def stages(self) -> dict[str, dict]:
        """Every finished stage's record, and the one in flight with what it has so far."""
        stages = dict(self.results)
        if self.current is not None and self.current not in stages:
            stages[self.current] = {"status": "in progress", **self.partial}
        return stages

    def goals(self) -> list[dict]:
        """Every goal of ``GOAL_TEXTS``, as its stage measured it: a stage cut short keeps the
        goals of the groups it had finished; one never measured says its stage's status."""
        stages, out = self.stages(), []
        for name, texts in GOAL_TEXTS.items():
            r = stages.get(name, {})
            measured = {g["goal"]: g for g in r.get("goals", [])}
            why = f"{name} stage {r.get('status', 'not run')}"
            out += [measured.get(text) or {"goal": text, "value": None,
                                           "status": f"not measured ({why})", "rows": []}
                    for text in texts]  # fmt: skip
        return [self.fused_step_goal(g, stages) for g in out]

    def fused_step_goal(self, goal: dict, stages: dict[str, dict]) -> dict:
        """The fused kernel's 124M goal is the train stage's compiled rove/rope, once the
        kernel is built (``RoveAttention`` takes it on CUDA where the shapes fit)."""
        text = GOAL_TEXTS["fused_attention"][1]
        if goal["goal"] != text or not stages.get("fused_attention", {}).get("built"):
            return goal
        (compiled,) = [g for g in self.goals_of(stages, "train")
                       if g["goal"] == GOAL_TEXTS["train"][1]] or [None]  # fmt: skip
        if compiled is None or compiled["value"] is None:
            return goal
        return self.goal(text, compiled["value"], GOALS["fused step"], "<=", "{:.3f}",
                         why="", rows=compiled["rows"])  # fmt: skip

    @staticmethod
    def goals_of(stages: dict[str, dict], name: str) -> list[dict]:
        return list(stages.get(name, {}).get("goals", []))

    def report(self) -> tuple[dict, str]:
        total = self.clock() - self.started
        goals = self.goals()
        title = "GPU suite" + (
            " (dry run: tiny sizes, code paths only)" if self.args.dry_run else ""
        )
        body = "\n\n".join([
            f"{total:.0f} s in all; stages: " + ", ".join(
                f"{k} {v['status']}" for k, v in self.results.items()),
            *(f"Note: {n}" for n in self.notes()),
            "#### Goals\n\n" + "\n".join(f"- {goal_line(g, bold=True)}" for g in goals),
            *self.markdown,
        ])  # fmt: skip
        data = {
            "machine": harness.machine(self.device),
            "command": harness.command_line(),
            "dry_run": self.args.dry_run,
            "seconds": total,
            "sizes": dataclasses.asdict(self.sizes),
            "goals": goals,
            "stages": self.stages(),
        }
        return data, f"{title}\n\n{body}"

    def save(self) -> None:
        """Write the JSON and the markdown as they stand (atomically: never half a file)."""
        data, text = self.report()
        title, body = text.split("\n\n", 1)
        if self.args.json is not None:
            write_atomic(self.args.json, json.dumps(data, indent=2, default=str))
        if self.args.markdown is not None:
            write_atomic(self.args.markdown, f"## {title}\n\n{body}\n")


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def goal_line(goal: dict, bold: bool = False) -> str:
    """``goal: value status (from: rows)`` (the value only where measured)."""
    status = f"**{goal['status']}**" if bold else goal["status"]
    line = f"{goal['goal']}: " + " ".join(filter(None, (goal.get("shown"), status)))
    if not goal.get("rows"):
        return line
    return (
        line + f" ({'from' if goal['value'] is not None else 'reads'}: {'; '.join(goal['rows'])})"
    )


def row_name(stage: str, row: dict) -> str:
    """A row as a goal names it: stage, what it times, mode and timing (kernel or dispatch)."""
    if stage == "graphs" or "op" in row:
        what = f"{row['group']} {row['op']}"
    elif stage == "fused_attention":
        what = f"T={row.get('seq')} fused RoVE vs RoPE+SDPA {row.get('pass')}"
    else:
        what = f"T={row['seq']} {row['backend']} layer {row['pass']}"
    return f"{stage}: {what} [{row.get('mode', 'mode not stated')}, " \
           f"{row.get('timing', 'timing not stated')}]"  # fmt: skip


def train_row_name(mode: str, variant: str, rows: dict[str, dict]) -> str:
    row = rows.get(f"{variant} {mode}", {"mode": mode, "timing": "dispatch"})
    return f"train: {variant} {mode} step [{row['mode']}, {row['timing']}]"


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, pass_: str,
                    causal: bool = True) -> float:  # fmt: skip
    """Matmul FLOPs of attention: forward 4 B H T^2 D (QK^T and PV), the backward 2.5x that
    (FlashAttention's convention: dV, dP, dQ, dK and S recomputed), causal half of each."""
    fwd = 4.0 * batch * heads * seq * seq * head_dim / (2 if causal else 1)
    return fwd * (3.5 if pass_ == "fwd+bwd" else 1.0)


def fused_row(row: dict) -> dict:
    """A fused-attention row with its mode and timing stated and the kernel's FLOP/s against
    the H200's peak added (from ``flops`` or its shape) where it has a time."""
    out = {"mode": "mode not stated", "timing": "timing not stated", **row}
    ms = out.get("fused_ms")
    if out.get("ratio") is None and ms and out.get("rope_sdpa_ms"):
        out["ratio"] = ms / out["rope_sdpa_ms"]  # unpaired: the row gave no paired ratio
    flops = out.get("flops")
    if flops is None and all(k in out for k in ("batch", "heads", "head_dim", "seq", "pass")):
        flops = attention_flops(out["batch"], out["heads"], out["seq"], out["head_dim"],
                                out["pass"], out.get("causal", True))  # fmt: skip
    if flops and ms and "tflops" not in out:
        out.update(flops=flops, tflops=flops / (ms / 1e3) / 1e12)
        out["of_peak"] = out["tflops"] * 1e12 / H200_PEAK_FLOPS
    return out


def _fmt(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _budget(text: str) -> tuple[str, float]:
    name, _, seconds = text.partition("=")
    if name not in BUDGETS or not seconds:
        raise argparse.ArgumentTypeError(f"expected STAGE=SECONDS with STAGE in {list(BUDGETS)}")
    return name, float(seconds)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU: code paths only")
    p.add_argument("--device", help="default: cuda if available (cpu for --dry-run)")
    p.add_argument("--stages", nargs="+", choices=list(BUDGETS), default=list(FIRST_RUN),
                   help=f"default: {' '.join(FIRST_RUN)} (the pilot is opt-in)")  # fmt: skip
    p.add_argument("--seqs", type=int, nargs="+", help="attention lengths (default: 1024)")
    p.add_argument("--budget", type=_budget, action="append", default=[], metavar="STAGE=S",
                   help=f"seconds per stage; defaults {BUDGETS}")  # fmt: skip
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--total", type=float, default=TOTAL, help="seconds for all stages together")
    p.add_argument("--json", type=Path, help="JSON output (default: $OUT/gpu_suite.json when "
                   "$OUT is set, else gpu_suite.json beside --results)")  # fmt: skip
    p.add_argument("--markdown", type=Path, help="markdown rewritten after each stage "
                   "(default: $OUT/gpu_suite.md when $OUT is set)")  # fmt: skip
    p.add_argument("--results", type=Path, help="markdown file the finished run is appended to "
                   "(default: $OUT/RESULTS.md when $OUT is set, else benchmarks/RESULTS.md; "
                   "none for --dry-run)")  # fmt: skip
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # run_child's
    args = p.parse_args(argv)
    args.budget = dict(args.budget)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available (try --dry-run)")
    if args.child:  # one stage for a parent suite, which reports it: only the JSON
        if args.json is None:
            p.error("--child needs --json")
        return args
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None  # the device's return folder
    if args.results is None and not args.dry_run:
        args.results = out / "RESULTS.md" if out else harness.RESULTS_MD
    if args.json is None:
        args.json = out / "gpu_suite.json" if out else (
            args.results.with_name("gpu_suite.json") if args.results else None)  # fmt: skip
    if args.markdown is None and out is not None:
        args.markdown = out / "gpu_suite.md"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    harness.set_threads(args.threads)
    suite = Suite(args)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"# rove GPU suite on {harness.machine(suite.device)}", flush=True)
        for note in suite.notes():
            print(f"note: {note}")
        suite.save()
        for name in STAGES:
            suite.run(name, getattr(suite, f"stage_{name}"))
        suite.save()
    except Interrupted as why:
        suite.save()  # run() saved the stage; this also covers a signal between stages
        print(f"\ninterrupted ({why}); results so far in {args.json}", flush=True)
        return 128 + getattr(signal, str(why), signal.SIGTERM).value
    finally:
        for sig, handler in previous.items():  # main() called in a process that goes on
            signal.signal(sig, handler)
    if args.child:
        return 0 if all(v["status"] == "ok" for v in suite.results.values()) else 1
    data, text = suite.report()
    title, body = text.split("\n\n", 1)
    harness.append_results(title, body, suite.device, args.results)
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
    status = main()
    print(f"gpu_suite.py exit status {status}", flush=True)  # timeout's own may hide it
    raise SystemExit(status)
