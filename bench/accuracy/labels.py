"""Labels from cause and outcome, and the symptom's onset from effect sizes. No rule is consulted.

Losses are compared by how much of the learning they keep: the *reduction* of the final
validation loss below the chance level ``ln(classes)`` (what a model that learned nothing
scores), so that a margin means the same on a task whose loss ends at 0.07 as on one that
ends at 0.5.

Clean. A sweep run is *clean* when its reduction is at least ``1 - CLEAN_MARGIN`` of the
reduction of its family's best configuration (lowest mean final validation loss over the
split's seeds) on the same seed (the same data), and its accuracy is within
``CLEAN_ACC_POINTS`` of that run's; otherwise it is *suboptimal* and left out of the scores
(a badly tuned run is neither healthy nor a fault).

Harm. A fault run is compared with its twin (the clean run it equals up to the onset):
*harmful* when it diverged (a non-finite loss or gradient), or lost more than ``HARM_LOSS``
of the twin's reduction, or more than ``HARM_ACC`` of its accuracy; *unharmed* (a near-miss
negative) when it lost at most ``NEAR_LOSS`` of the reduction and ``NEAR_ACC`` of the
accuracy; otherwise *grey*, left out.

Who should fire. On a harmful run, the fault's ``detects`` rules (plus
``detects_if_diverged`` when it diverged) are positives; its ``tolerated`` rules may fire
without a false alarm (on a diverged run every rule may). Clean runs, unharmed runs, and
harmful runs of faults that neither detect nor tolerate a rule are that rule's negatives.

Onset. The fault is switched on at ``spec.onset`` (the cause). The symptom's onset is the
first training step at or after it where one of the fault's signals (the bench's own
per-step measurements, ``record.py``) differs from the twin's by at least ``EFFECT`` robust
standard deviations of the twin's own fluctuation (1.4826 x the median absolute deviation
of the twin's signal around its 11-step running median; for evaluation signals, of its
successive differences), sustained for ``SUSTAIN`` consecutive measurements. Per-batch
signals (loss, label shares, input statistics, padding share) are first averaged over a
trailing ``SMOOTH_STEPS``-step window, so batch noise does not hide a shift. A harmful run
without such a step keeps the switch-on step (reported as a fallback). Detection delay is
the alert's training step minus the symptom's onset.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.accuracy import plan
from bench.accuracy.corpus import Run, load_runs

CLEAN_MARGIN = 0.20
CLEAN_ACC_POINTS = 0.05
HARM_LOSS = 0.10
HARM_ACC = 0.03
NEAR_LOSS = 0.03
NEAR_ACC = 0.01
EFFECT = 3.0
SUSTAIN = 3
SUSTAIN_EVAL = 2

#: where a rule can be judged at all (elsewhere it has nothing to read: not scored)
APPLICABLE: dict[str, tuple[str, ...]] = {
    "CheckInputImages": ("cnn", "resnet"),
    "NLPSequenceRatio": ("lstm", "transformer"),
    "TreeDepth": ("xgboost",),
    "FeatureImportanceOverweight": ("xgboost",),
}
TORCH_ONLY = True


def applicable(rule: str, family: str) -> bool:
    if rule in APPLICABLE:
        return family in APPLICABLE[rule]
    return family != "xgboost"


def chance_loss(family: str) -> float:
    """The validation loss of a model that learned nothing: ln(classes)."""
    return math.log(2 if family == "xgboost" else 4)


def _reduction(family: str, loss: float) -> float:
    return chance_loss(family) - loss


def _best_by_family(runs: list[Run]) -> dict[tuple[str, str], dict[str, Any]]:
    """(split, family) -> the best configuration (lowest mean final loss) and its runs' outcomes by seed."""
    groups: dict[tuple[str, str, str], list[Run]] = defaultdict(list)
    for r in runs:
        spec = r.spec
        if spec.fault is None:
            groups[(spec.split, spec.family, json.dumps(spec.config, sort_keys=True))].append(r)
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for (split, family, cfg), members in groups.items():
        losses = [m.outcome["val_loss"] for m in members]
        if any(v is None or not math.isfinite(v) for v in losses):
            continue
        mean = float(np.mean(losses))
        key = (split, family)
        if key not in best or mean < best[key]["val_loss"]:
            best[key] = {
                "val_loss": mean,
                "config": cfg,
                "by_seed": {m.spec.seed: m.outcome for m in members},
            }
    return best


def clean_label(run: Run, best: dict[tuple[str, str], dict[str, Any]]) -> str:
    o = run.outcome
    ref = best.get((run.spec.split, run.spec.family))
    if ref is None or o["val_loss"] is None or o.get("diverged"):
        return "suboptimal"
    same = ref["by_seed"].get(run.spec.seed)
    if same is None:
        return "suboptimal"
    family = run.spec.family
    ok = _reduction(family, o["val_loss"]) >= (1 - CLEAN_MARGIN) * _reduction(family, same["val_loss"]) and (
        o["val_acc"] is None or o["val_acc"] >= same["val_acc"] - CLEAN_ACC_POINTS
    )
    return "clean" if ok else "suboptimal"


def clean_twins(cache: Path, split: str) -> dict[str, list[plan.RunSpec]]:
    runs = [r for r in load_runs(cache) if r.spec.split == split and r.spec.fault is None]
    best = _best_by_family(runs)
    out: dict[str, list[plan.RunSpec]] = defaultdict(list)
    for r in runs:
        if clean_label(r, best) == "clean":
            out[r.spec.family].append(r.spec)
    for specs in out.values():
        specs.sort(key=lambda s: s.run_id)
    return dict(out)


def harm(run: Run, twin: Run) -> tuple[str, float | None, float | None]:
    """(verdict, share of the twin's loss reduction lost, accuracy change)."""
    o, c = run.outcome, twin.outcome
    if o.get("diverged") or o["val_loss"] is None or not math.isfinite(o["val_loss"]):
        return "harmful", None, None
    lost = (o["val_loss"] - c["val_loss"]) / max(_reduction(run.spec.family, c["val_loss"]), 1e-6)
    dacc = (
        (o["val_acc"] - c["val_acc"])
        if o.get("val_acc") is not None and c.get("val_acc") is not None
        else 0.0
    )
    if lost > HARM_LOSS or dacc < -HARM_ACC:
        return "harmful", lost, dacc
    if lost <= NEAR_LOSS and dacc >= -NEAR_ACC:
        return "unharmed", lost, dacc
    return "grey", lost, dacc


# ------------------------------------------------------------------------------ onsets
_LOG_SIGNALS = {"gnorm", "gfirst", "upd", "wvar", "xstd"}
#: per-batch signals whose batch-to-batch noise would hide a shift: a trailing mean first
_SMOOTHED = {"loss", "ymax", "yconf", "xmean", "xstd", "pad"}
SMOOTH_STEPS = 10


def _series(run: Run, name: str) -> tuple[np.ndarray, np.ndarray, bool]:
    """(steps, values, is_eval) of one signal; missing values are NaN."""
    trace = run.trace()
    sig = trace["signals"]
    if name == "gap":
        loss = np.array([np.nan if v is None else v for v in sig["loss"]], float)
        steps, vals = [], []
        for e in trace["evals"]:
            t = int(e["step"])
            window = loss[max(0, t - plan.EVAL_EVERY + 1) : t + 1]
            train = float(np.nanmean(window)) if np.isfinite(window).any() else np.nan
            v = e["val_loss"]
            steps.append(t)
            vals.append(np.nan if v is None else v - train)
        return np.array(steps), np.array(vals, float), True
    if name == "lossvar":
        loss = np.array([np.nan if v is None else v for v in sig["loss"]], float)
        with warnings.catch_warnings():  # an all-NaN window (a diverged run) is NaN, as meant
            warnings.simplefilter("ignore", RuntimeWarning)
            vals = np.array([np.nanstd(loss[max(0, t - 9) : t + 1]) for t in range(len(loss))])
        return np.arange(len(loss)), vals, False
    raw = sig.get(name)
    if raw is None:
        return np.array([]), np.array([]), False
    vals = np.array([np.nan if v is None else v for v in raw], float)
    if name in _LOG_SIGNALS:
        with np.errstate(divide="ignore", invalid="ignore"):
            vals = np.log10(np.maximum(vals, 1e-30))
    if name == "xmean":
        vals = np.abs(vals)
    if name in _SMOOTHED:
        vals = _trailing_mean(vals, SMOOTH_STEPS)
    return np.arange(len(vals)), vals, False


def _trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    out = np.empty_like(values)
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        finite = chunk[np.isfinite(chunk)]
        out[i] = finite.mean() if len(finite) == len(chunk) else np.nan
    return out


def _robust_scale(values: np.ndarray, is_eval: bool) -> float:
    v = values[np.isfinite(values)]
    if len(v) < 4:
        return 1e-6
    if is_eval:
        dev = np.diff(v) / math.sqrt(2)
    else:
        pad = 5
        ext = np.pad(v, pad, mode="edge")
        med = np.array([np.median(ext[i : i + 2 * pad + 1]) for i in range(len(v))])
        dev = v - med
    mad = float(np.median(np.abs(dev - np.median(dev))))
    floor = 1e-3 * (abs(float(np.median(v))) + 1e-12)
    return max(1.4826 * mad, floor, 1e-9)


def symptom_onset(run: Run, twin: Run, signals: tuple[str, ...], inject: int) -> int | None:
    """First training step >= inject where a signal departs from the twin's (see the module doc)."""
    best: int | None = None
    for name in signals:
        if name == "nonfinite":
            f = run.trace()["signals"]["nonfinite"]
            hits = [t for t in range(inject, len(f)) if f[t] == 1.0]
            if hits:
                best = hits[0] if best is None else min(best, hits[0])
            continue
        steps, fv, is_eval = _series(run, name)
        _, cv, _ = _series(twin, name)
        if len(fv) == 0 or len(cv) != len(fv):
            continue
        sigma = _robust_scale(cv[steps < inject] if (steps < inject).sum() >= 10 else cv, is_eval)
        diff = fv - cv
        off = (
            np.where(np.isnan(diff), np.where(np.isnan(fv) & ~np.isnan(cv), np.inf, 0.0), np.abs(diff))
            >= EFFECT * sigma
        )
        need = SUSTAIN_EVAL if is_eval else SUSTAIN
        for i in range(len(steps)):
            if steps[i] < inject:
                continue
            window = off[i : i + need]
            if len(window) == need and window.all():
                t = int(steps[i])
                best = t if best is None else min(best, t)
                break
    return best


# ------------------------------------------------------------------------------ all labels
def label_corpus(cache: Path, write: bool = True) -> dict[str, dict[str, Any]]:
    """Label every stored run; writes ``labels.json`` beside each; returns run_id -> labels."""
    runs = load_runs(cache)
    by_id = {r.run_id: r for r in runs}
    best = _best_by_family(runs)
    out: dict[str, dict[str, Any]] = {}
    for r in runs:
        spec = r.spec
        lab: dict[str, Any] = {
            "split": spec.split,
            "family": spec.family,
            "fault": spec.fault,
            "grade": spec.grade,
        }
        if spec.fault is None:
            lab["kind"] = clean_label(r, best)
            ref = best.get((spec.split, spec.family), {})
            lab["best"] = {"config": ref.get("config"), "same_seed": ref.get("by_seed", {}).get(spec.seed)}
        else:
            kind = plan.FAULTS_BY_NAME[spec.fault]
            twin = by_id.get(spec.twin or "")
            lab["kind"] = "fault"
            if twin is None:
                lab["harm"] = "no-twin"
                out[r.run_id] = lab
                continue
            verdict, rel, dacc = harm(r, twin)
            diverged = bool(r.outcome.get("diverged"))
            lab.update({"harm": verdict, "lost_reduction": rel, "delta_acc": dacc, "diverged": diverged})
            inject = int(spec.onset or 0)
            lab["inject_step"] = inject
            if kind.at_start:
                lab["onset_step"], lab["onset_method"] = 0, "start"
            else:
                onset = symptom_onset(r, twin, kind.signals, inject)
                if onset is None:
                    lab["onset_step"], lab["onset_method"] = inject, "fallback"
                else:
                    lab["onset_step"], lab["onset_method"] = onset, "effect"
            detects = set(kind.detects) | (set(kind.detects_if_diverged) if diverged else set())
            tolerated = set(kind.tolerated) | (set(kind.detects_if_diverged) - detects)
            lab["positive_for"] = (
                sorted(d for d in detects if applicable(d, spec.family)) if verdict == "harmful" else []
            )
            lab["tolerated"] = "*" if diverged and verdict == "harmful" else sorted(tolerated)
        out[r.run_id] = lab
        if write:
            (r.root / "labels.json").write_text(json.dumps(lab, indent=1, sort_keys=True))
    return out
