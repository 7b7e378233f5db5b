"""The recovery of a finetune comparison: how soon a converted model wins back its input's loss.

A finetune comparison (``results["config"]["train"]["init_from"]`` set) starts every run from
one existing model: the baseline arm (RoPE) continues it unchanged, each other arm (RoVE)
converts it at step 0 and continues. The arms of a seed see the same tokens in the same order
under the same schedule, so their validation losses at *equal steps* are paired; the baseline's
step-0 loss is the input model's, another arm's step-0 loss is the just-converted model's.

Runs may lack validation steps (an interrupted run, another ``eval_interval``): only steps both
arms have are compared, and what could not be paired is said in words, never guessed.

The end is not one validation: each validation scores a small sample of held-out tokens, and
the gap between the arms moves from one to the next by about as much as a typical end gap. The
end is therefore the mean of the last ``END_POINTS`` common validations after step 0 (fewer
when the run has fewer than twice as many: the end never reaches into its first half), and the
gap's step-to-step noise (the root mean square of its change between successive common
validations over the second half of the run) is given beside it.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

from rove.stats import Paired, paired, summarize

__all__ = [
    "END_POINTS",
    "SeedRecovery",
    "caught_up_text",
    "converted_at",
    "converted_text",
    "end_paired",
    "init_from",
    "reached_text",
    "recoveries",
    "recovery_findings",
    "seeds_cell",
    "val_curve",
]


END_POINTS = 3  # validations averaged for a run's end (at most the second half of them)


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
    # the arm's loss just converted: at step 0, or a smooth conversion's at its ramp's end
    converted_loss: float | None
    end_step: int | None  # the last validation step both arms have
    end_baseline: float | None  # mean over end_steps
    end_method: float | None  # mean over end_steps
    reached: int | None  # first validation step with a loss <= input_loss
    last_step: int | None  # the arm's last validation step: "not within N steps"
    caught_up: int | None  # first common step from which the arm is <= baseline at every later one
    missing: tuple[str, ...]  # what could not be paired, one phrase each
    end_steps: tuple[int, ...] = ()  # the common steps the end averages (see END_POINTS)
    gap_noise: float | None = None  # rms step-to-step change of the gap, second half of the run
    converted_step: int | None = 0  # the validation step converted_loss is taken at

    @property
    def end_gap(self) -> float | None:
        """Arm minus baseline over ``end_steps`` (positive: the converted arm is worse)."""
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
    at = converted_at(method, m)
    reached = None
    if input_loss is not None and at is not None:
        reached = next((s for s in sorted(m) if s >= at and m[s] <= input_loss), None)
    caught_up = None
    for s in reversed(common):  # walk back while the arm stays at or below the baseline
        if m[s] > b[s]:
            break
        caught_up = s
    later = [s for s in common if s > 0] or common
    ends = later[-min(END_POINTS, max(1, len(later) // 2)) :]  # never the recovery's first half
    return SeedRecovery(
        seed=seed,
        input_loss=input_loss,
        converted_loss=m.get(at) if at is not None else None,
        end_step=ends[-1] if ends else None,
        end_baseline=statistics.fmean(b[s] for s in ends) if ends else None,
        end_method=statistics.fmean(m[s] for s in ends) if ends else None,
        reached=reached,
        last_step=max(m) if m else None,
        caught_up=caught_up,
        missing=tuple(missing),
        end_steps=tuple(ends),
        gap_noise=_gap_noise([m[s] - b[s] for s in later[len(later) // 2 :]]),
        converted_step=at,
    )


def converted_at(run: dict, curve: dict[int, float]) -> int | None:
    """The validation step at which ``run`` is converted: 0, or for a smooth conversion the
    first validation at or after its ramp's end (None if the curve stops before it). A smooth
    arm's step-0 loss is the input model's by construction; its conversion's cost shows once
    V and O rotate by all of RoVE's angles."""
    if run.get("conversion") != "smooth" or not run.get("ramp_steps"):
        return 0
    return next((s for s in sorted(curve) if s >= run["ramp_steps"]), None)


def _gap_noise(gaps: list[float]) -> float | None:
    """Root mean square of the change between successive gaps (None with fewer than two)."""
    steps = [b - a for a, b in itertools.pairwise(gaps)]
    return math.sqrt(statistics.fmean(d * d for d in steps)) if steps else None


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


def converted_text(recs: list[SeedRecovery]) -> str:
    """When the converted loss was taken: "just converted (step 0)", or at a smooth
    conversion's ramp's end."""
    steps = sorted({r.converted_step for r in recs if r.converted_step is not None})
    if steps in ([], [0]):
        return "just converted (step 0)"
    span = str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"
    return f"converted (step {span}, where its smooth conversion's ramp ends)"


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


def end_text(recs: list[SeedRecovery]) -> str:
    """Which validations the end averages: ``the last 3 validations (steps 60, 70, 80)``."""
    windows = sorted({r.end_steps for r in recs if r.end_steps})
    if not windows:
        return "the end"
    if len(windows) == 1:
        (steps,) = windows
        which = "validation" if len(steps) == 1 else f"{len(steps)} validations"
        return (
            f"the last {which} (step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))})"
        )
    return "the last validations both arms have (they differ by seed: see the table)"


def noise_text(recs: list[SeedRecovery]) -> str:
    """The gap's step-to-step noise in words, or that there were too few validations for it."""
    noise = summarize([r.gap_noise for r in recs])
    if not noise.n:
        return "too few validations to measure the gap's step-to-step noise"
    return (
        f"the gap moves by ±{noise.mean:.4f} nats from one validation to the next (root mean "
        f"square over the second half of the run, mean over {noise.n} seed(s))"
    )


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
            f"- Recovery: {converted_text(start)}, {label} has a validation loss of {conv:.4f} "
            f"({conv - inp:+.4f} nats vs the input model's {inp:.4f}); it {back}."
        )
    gaps = {r.seed: g for r in recs if (g := r.end_gap) is not None}
    ended = [r for r in recs if r.seed in gaps]
    if ended:
        p = end_paired(recs)
        at = f"Over {end_text(ended)}"
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
            f"{seeds}; {p.test_text()}); {noise_text(ended)}."
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
