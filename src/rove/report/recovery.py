"""The recovery of a finetune comparison: how soon a converted model wins back its input's loss.

A finetune comparison (``results["config"]["train"]["init_from"]`` set) starts every run from
one existing model: the baseline arm (RoPE) continues it unchanged, each other arm (RoVE)
converts it at step 0 and continues. The arms of a seed see the same tokens in the same order
under the same schedule, so their validation losses at *equal steps* are paired; the baseline's
step-0 loss is the input model's, another arm's step-0 loss is the just-converted model's.

Runs may lack validation steps (an interrupted run, another ``eval_interval``): only steps both
arms have are compared, and what could not be paired is said in words, never guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rove.stats import Paired, paired, summarize

__all__ = [
    "SeedRecovery",
    "caught_up_text",
    "end_paired",
    "init_from",
    "reached_text",
    "recoveries",
    "recovery_findings",
    "seeds_cell",
    "val_curve",
]


def init_from(results: dict) -> str | None:
    """The model a finetune comparison continues (``TrainConfig.init_from``), else None."""
    return (results.get("config") or {}).get("train", {}).get("init_from") or None


def val_curve(run: dict) -> dict[int, float]:
    """Step -> finite validation loss of a run's curve (training-only steps left out)."""
    out = {}
    for point in run.get("curve", []):
        v = point.get("val_loss")
        if v is not None and math.isfinite(v):
            out[int(point["step"])] = float(v)
    return out


@dataclass(frozen=True)
class SeedRecovery:
    """One seed's recovery of arm ``label`` against the ``baseline`` arm (None: not measured)."""

    seed: int
    input_loss: float | None  # the baseline's step-0 loss: the input model
    converted_loss: float | None  # the arm's step-0 loss: just converted
    end_step: int | None  # the last validation step both arms have
    end_baseline: float | None
    end_method: float | None
    reached: int | None  # first validation step with a loss <= input_loss
    last_step: int | None  # the arm's last validation step: "not within N steps"
    caught_up: int | None  # first common step from which the arm is <= baseline at every later one
    missing: tuple[str, ...]  # what could not be paired, one phrase each

    @property
    def end_gap(self) -> float | None:
        """Arm minus baseline at ``end_step`` (positive: the converted arm is worse)."""
        if self.end_method is None or self.end_baseline is None:
            return None
        return self.end_method - self.end_baseline


def _steps_text(steps: list[int], most: int = 5) -> str:
    shown = ", ".join(map(str, steps[:most]))
    return shown if len(steps) <= most else f"{shown}, ... ({len(steps)} in all)"


def _seed_recovery(
    seed: int, method: dict | None, base: dict | None, label: str, baseline: str
) -> SeedRecovery:
    if method is None or base is None:
        absent = label if method is None else baseline
        return SeedRecovery(seed, None, None, None, None, None, None, None, None,
                            (f"no {absent} run",))  # fmt: skip
    m, b = val_curve(method), val_curve(base)
    missing = []
    if 0 not in b:
        missing.append(f"{baseline} has no step-0 validation (the input model's loss)")
    if 0 not in m:
        missing.append(f"{label} has no step-0 validation (the just-converted model's loss)")
    for have, lack, steps in ((baseline, label, b.keys() - m.keys() - {0}),
                              (label, baseline, m.keys() - b.keys() - {0})):  # fmt: skip
        if steps:
            missing.append(
                f"{lack} has no validation at step(s) {_steps_text(sorted(steps))} that "
                f"{have} has (an interrupted run, or another eval_interval)"
            )
    common = sorted(m.keys() & b.keys())
    if not common:
        missing.append("no validation step in common")
    input_loss = b.get(0)
    reached = None
    if input_loss is not None:
        reached = next((s for s in sorted(m) if m[s] <= input_loss), None)
    caught_up = None
    for s in reversed(common):  # walk back while the arm stays at or below the baseline
        if m[s] > b[s]:
            break
        caught_up = s
    end = common[-1] if common else None
    return SeedRecovery(
        seed=seed,
        input_loss=input_loss,
        converted_loss=m.get(0),
        end_step=end,
        end_baseline=b.get(end) if end is not None else None,
        end_method=m.get(end) if end is not None else None,
        reached=reached,
        last_step=max(m) if m else None,
        caught_up=caught_up,
        missing=tuple(missing),
    )


def recoveries(runs: list[dict], label: str, baseline: str) -> list[SeedRecovery]:
    """Per seed (every seed either arm has, sorted), arm ``label`` against ``baseline``."""
    by_seed: dict[str, dict[int, dict]] = {label: {}, baseline: {}}
    for r in runs:
        if r["label"] in by_seed:
            by_seed[r["label"]][r["seed"]] = r
    seeds = sorted(by_seed[label].keys() | by_seed[baseline].keys())
    return [
        _seed_recovery(s, by_seed[label].get(s), by_seed[baseline].get(s), label, baseline)
        for s in seeds
    ]


def reached_text(rec: SeedRecovery) -> str:
    """When the arm reached the input model's loss, in a table cell's words."""
    if rec.reached is not None:
        return f"step {rec.reached}"
    if rec.input_loss is None or rec.last_step is None:
        return "n/a"
    return f"not within {rec.last_step} steps" if rec.last_step else "no validation after step 0"


def caught_up_text(rec: SeedRecovery) -> str:
    """From which step the arm stays at or below the baseline, in a table cell's words."""
    if rec.caught_up is not None:
        return f"step {rec.caught_up}"
    return "n/a" if rec.end_step is None else "never"


def _seeds(recs: list[SeedRecovery]) -> str:
    ids = [str(r.seed) for r in recs]
    return f"seed {ids[0]}" if len(ids) == 1 else f"seeds {', '.join(ids)}"


def _by_step(recs: list[SeedRecovery], step_of: str, after: str = "") -> str:
    """'step 100 in seed 0, step 150 in seeds 1, 2' (``after`` follows each step) for the seeds
    where ``step_of`` is set."""
    groups: dict[int, list[SeedRecovery]] = {}
    for r in recs:
        groups.setdefault(getattr(r, step_of), []).append(r)
    return ", ".join(f"step {s}{after} in {_seeds(rs)}" for s, rs in sorted(groups.items()))


def seeds_cell(recs: list[SeedRecovery], step_of: str) -> str:
    """The mean row's cell of a step column: how many seeds got there, and by which step."""
    done = [getattr(r, step_of) for r in recs if getattr(r, step_of) is not None]
    if not done:
        return "no seed"
    which = "all" if len(done) == len(recs) else f"{len(done)} of"
    return f"{which} {len(recs)} seeds, by step {max(done)}"


def end_paired(recs: list[SeedRecovery]) -> Paired:
    """The arm minus the baseline at the end, paired over the seeds where both have an end."""
    ended = [r for r in recs if r.end_gap is not None]
    return paired(
        {r.seed: r.end_method for r in ended},
        {r.seed: r.end_baseline for r in ended},
        lambda a, b: a < b,  # a lower loss is better
    )


def recovery_findings(recs: list[SeedRecovery], label: str, baseline: str) -> list[str]:
    """Plain-language bullets: the conversion's cost, when it was recovered, how the arms end."""
    lines = []
    start = [r for r in recs if r.input_loss is not None and r.converted_loss is not None]
    if start:
        inp = summarize([r.input_loss for r in start]).mean
        conv = summarize([r.converted_loss for r in start]).mean
        reached = [r for r in start if r.reached is not None]
        late = "; ".join(f"{reached_text(r)} in seed {r.seed}" for r in start if r.reached is None)
        if reached:
            back = f"is back at the input model's loss at {_by_step(reached, 'reached')}"
            back += f"; {late}" if late else ""
        else:
            back = f"is not back at the input model's loss: {late}"
        lines.append(
            f"- Recovery: just converted, {label} has a validation loss of {conv:.4f} "
            f"({conv - inp:+.4f} nats vs the input model's {inp:.4f}); it {back}."
        )
    gaps = {r.seed: g for r in recs if (g := r.end_gap) is not None}
    ended = [r for r in recs if r.seed in gaps]
    if ended:
        p = end_paired(recs)
        steps = sorted({r.end_step for r in ended if r.end_step is not None})
        at = (
            f"At the end (step {steps[0]})"
            if len(steps) == 1
            else f"At the last step both arms validated ({_by_step(ended, 'end_step')})"
        )
        gap = p.diff.mean
        if gap > 0:
            verdict = f"{label} is worse than continued {baseline} by {gap:.4f} nats"
        elif gap < 0:
            verdict = f"{label} is better than continued {baseline} by {-gap:.4f} nats"
        else:
            verdict = f"{label} and continued {baseline} are tied"
        sides = (
            ("worse", [r for r in ended if gaps[r.seed] > 0]),
            ("better", [r for r in ended if gaps[r.seed] < 0]),
            ("tied", [r for r in ended if gaps[r.seed] == 0]),
        )
        seeds = "; ".join(f"{word} in {_seeds(rs)}" for word, rs in sides if rs)
        lines.append(
            f"- {at}, {verdict} of validation loss (mean over {p.n} seed(s); "
            f"{seeds}; {p.test_text()})."
        )
        caught = [r for r in ended if r.caught_up is not None]
        never = [r for r in ended if r.caught_up is None]
        above = f"in {_seeds(never)} (above {baseline} at the end)"
        if caught:
            stays = f"stays at or below {baseline} at equal steps from "
            stays += _by_step(caught, "caught_up", " on") + (f"; never {above}" if never else "")
        else:
            stays = f"never stays at or below {baseline} at equal steps {above}"
        lines.append(f"- {label} {stays}.")
    unpaired = [r for r in recs if r.missing]
    if unpaired:
        lines.append(
            f"- Recovery not fully paired in {_seeds(unpaired)}: see the Recovery section."
        )
    return lines
