"""What ran: the lines every comparison report opens with.

A finding travels only with what decided its numbers: the precision (a bf16 and an fp32 run of
the same recipe differ in which seeds win), the hardware and its kernel level, torch, whether a
run was stopped and resumed, and the data. They are read from the records the runs and the
comparison wrote (``summary.json``'s ``machine`` and ``resumed_at``, ``results.json``'s
``precision`` and ``host``, each evaluation's ``data``); what an older record lacks is said to
be unrecorded, never guessed.
"""

from __future__ import annotations

from rove.precision import describe_machine

__all__ = ["what_ran"]


def what_ran(results: dict) -> list[str]:
    """Markdown bullets: precision, machines, torch, resumes and data of ``results``."""
    runs = results["runs"]
    trains = [r.get("train") or {} for r in runs]
    lines = [f"- Precision: {_precision(results, trains)}."]
    machines = sorted({describe_machine(t["machine"]) for t in trains if t.get("machine")})
    lines.append(
        "- Trained on: " + ("; ".join(machines) if machines else "not recorded (older runs)") + "."
    )
    if host := results.get("host"):
        lines.append(f"- Evaluated and reported on: {describe_machine(host)}.")
    versions = sorted({str(t.get("torch_version")) for t in trains if t.get("torch_version")})
    lines.append(f"- torch {', '.join(versions) or 'not recorded'}.")
    lines.append(f"- Resumed: {_resumes(runs)}.")
    lines.append(f"- Data: {_data(runs)}.")
    return lines


def _precision(results: dict, trains: list[dict]) -> str:
    ran = sorted({str(t.get("precision")) for t in trains if t.get("precision")})
    recorded = results.get("precision") or {}
    why = str(recorded.get("why", "")).removeprefix("precision: ")
    if len(ran) > 1:
        return f"MIXED ({', '.join(ran)}): the runs do not share one precision"
    if why:
        return why
    return f"{ran[0]} (the runs' record; why it was chosen was not recorded)" if ran else "?"


def _resumes(runs: list[dict]) -> str:
    if any("resumed_at" not in (r.get("train") or {}) for r in runs):
        return "not recorded for every run (older runs)"
    resumed = [
        f"{r['label']} seed {r['seed']} at step(s) {', '.join(map(str, r['train']['resumed_at']))}"
        for r in runs
        if r["train"]["resumed_at"]
    ]
    if not resumed:
        return "no run was stopped and resumed"
    return "; ".join(resumed) + " (a resumed run repeats the uninterrupted one's steps)"


def _data(runs: list[dict]) -> str:
    data = [r.get("data") or {} for r in runs]
    prints = sorted({str(d["fingerprint"])[:12] for d in data if d.get("fingerprint")})
    shas = sorted({str(d["manifest_sha256"])[:12] for d in data if d.get("manifest_sha256")})
    if not prints:
        return "fingerprint not recorded"
    text = f"fingerprint {', '.join(prints)}, manifest sha256 {', '.join(shas) or '?'}"
    return text if len(prints) == 1 else f"DIFFERENT datasets: {text}"
