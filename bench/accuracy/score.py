"""Scoring (precision, recall, clean-twin alarms, detection delay) and the Markdown report."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from bench.accuracy.faults import BASES, FAULTS
from bench.accuracy.oracle import PERSIST
from bench.accuracy.train import ALTERNATIVES, DEFAULT_RULES, EXTRA_COLLECTIONS

#: an alert this many steps or more before the oracle's onset is premature: it is counted as a
#: false alarm (and the run as missed), since the symptom it reports was not there yet
PREMATURE = 10

#: (trainguard default, SageMaker default, AUTOTRAINER / TheDeepChecker where they differ)
THRESHOLDS: dict[str, tuple[str, str, str]] = {
    "ExplodingTensor": ("any NaN/Inf in any saved tensor or scalar", "same", "AUTOTRAINER: NaN loss/weights"),
    "VanishingGradient": ("mean abs grad < 1e-7", "same", "AUTOTRAINER: see GradientNormRatio"),
    "GradientNormRatio": (
        "first/last grad norm < 1e-3 and first < 1e-4; > 70",
        "not in SageMaker",
        "AUTOTRAINER: same (1e-3, 1e-4, 70)",
    ),
    "DeadRelu": ("> 50% of a layer's units active in < 1% of samples", "same", "not compared"),
    "SaturatedActivation": (
        "> 50% of units inside tanh +-9.4999 / sigmoid -23..17 in < 1% of samples",
        "same",
        "not compared",
    ),
    "LossNotDecreasing": (
        "num_steps 10, diff_percent 0, increase_threshold_percent 5, mode None (EVAL first)",
        "same (later docs: diff_percent 0.1, mode GLOBAL)",
        "—",
    ),
    "Overfit": ("(val-train)/train > 0.1, patience 1", "same", "—"),
    "Overtraining": (
        "no improvement by 0.1 for 5 TRAIN / 10 EVAL saved steps",
        "same (steps were 500 apart)",
        "—",
    ),
    "PoorWeightInitialization": (
        "first 10 steps: relu_input variance ratio > 10, grad p95-p5 < 0.001, loss stale 5 steps",
        "same",
        "—",
    ),
    "WeightUpdateRatio": ("update/weight norm > 10 or < 1e-8", "same", "—"),
    "AllZero": ("100% zeros in any saved tensor", "same", "—"),
    "UnchangedTensor": ("allclose (rtol 1e-5, atol 1e-8) over 3 saved steps, any saved tensor", "same", "—"),
    "ClassImbalance": ("after 500 labels: count ratio > 10 or a class mispredicted > 70%", "same", "—"),
    "Confusion": ("per step: diagonal < 0.9 or off-diagonal > 0.1 (row-normalised)", "same", "—"),
    "CheckInputImages": ("after 500 images: abs(mean) > 0.2; regex .*hybridsequential0_input_0", "same", "—"),
    "DataNotNormalized": (
        "abs(mean) > 1 or std > 10 (inputs collection)",
        "not in SageMaker",
        "TheDeepChecker: inputs outside a normalised range",
    ),
    "OscillatingLoss": (
        "reversals >= 0.03 in >= 20% of the last 50 losses (after 10)",
        "not in SageMaker",
        "AUTOTRAINER: swings >= 0.03 in >= 20% of evaluations",
    ),
}

#: the oracle's condition for each rule, in words (computed every step on full tensors)
ORACLE_TEXT: dict[str, str] = {
    "ExplodingTensor": (
        "a NaN or +-Inf in the loss, a parameter, a gradient, an activation or the input batch"
    ),
    "VanishingGradient": "min over gradient tensors of mean(abs(g)) < 1e-7",
    "GradientNormRatio": (
        "weight gradients in parameter order: norm(first)/norm(last) < 1e-3 with "
        "norm(first) < 1e-4, or the ratio > 70"
    ),
    "DeadRelu": (
        "a ReLU layer (batch) with > 50% of units (channels for convolutions) positive in < 1% of samples"
    ),
    "SaturatedActivation": (
        "a tanh/sigmoid layer with > 50% of units whose input is inside the band in < 1% of samples"
    ),
    "LossNotDecreasing": (
        "whole-training-set loss not lower than 10 steps earlier, or > 5% above its minimum so far"
    ),
    "Overfit": "(whole-validation-set loss - whole-training-set loss) / training loss > 0.1",
    "Overtraining": (
        "whole-training-set loss not improved by 0.1 for 5 steps, or validation loss for 50 steps "
        "(10 evaluations)"
    ),
    "PoorWeightInitialization": (
        "within the first 10 steps: relu_input variance max/min across layers > 10, a "
        "gradient's p95-p5 < 0.001, or the whole-training-set loss not improving for 5 steps"
    ),
    "WeightUpdateRatio": (
        "a weight tensor with norm(W_t+1 - W_t)/(norm(W_t)+1e-9) > 10 or < 1e-8 at this step"
    ),
    "AllZero": "a parameter, gradient, activation or input tensor that is entirely 0",
    "UnchangedTensor": (
        "a parameter, gradient or activation allclose (rtol 1e-5, atol 1e-8) to itself for 20 steps"
    ),
    "ClassImbalance": (
        "labels seen so far with max/min class count > 10, or a class mispredicted in > 70% of its "
        "labels among the last 500"
    ),
    "Confusion": (
        "the batch's row-normalised confusion matrix has a diagonal entry < 0.9 or an off-diagonal > 0.1"
    ),
    "CheckInputImages": "abs(mean) of the input batch > 0.2",
    "DataNotNormalized": "abs(mean) of the input batch > 1 or its std > 10",
    "OscillatingLoss": (
        "whole-training-set loss reverses direction by >= 0.03 in >= 20% of the last 50 steps (after 10)"
    ),
}


def _base_rule(config_name: str) -> str:
    return config_name.split("[", 1)[0]


def score(records: list[dict[str, Any]], config_name: str) -> dict[str, Any]:
    rule = _base_rule(config_name)
    tp = fp = fn = tn = premature = errors = 0
    delays: list[int] = []
    clean_alerts: list[str] = []
    clean_pos_alerts = 0
    clean_n = 0
    for rec in records:
        onset = rec["onsets"].get(rule)
        verdict = rec["verdicts"].get(config_name, {})
        status = verdict.get("status")
        alert = status == "IssuesFound"
        errors += status == "Error"
        at = verdict.get("iteration")
        if rec["fault"] is None:
            clean_n += 1
            if alert:
                clean_alerts.append(rec["run"])
                clean_pos_alerts += onset is not None
        if onset is None:
            fp += alert
            tn += not alert
        elif alert and at is not None and at <= onset - PREMATURE:
            premature += 1
            fp += 1
            fn += 1
        elif alert:
            tp += 1
            delays.append(int(at) - int(onset))
        else:
            fn += 1
    return {
        "rule": config_name,
        "positives": tp + fn,
        "alerts": tp + fp,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "premature": premature,
        "errors": errors,
        "precision": tp / (tp + fp) if tp + fp else None,
        "recall": tp / (tp + fn) if tp + fn else None,
        "clean_alerts": len(clean_alerts),
        "clean_pos_alerts": clean_pos_alerts,
        "clean_n": clean_n,
        "median_delay": statistics.median(delays) if delays else None,
        "max_delay": max(delays) if delays else None,
    }


def meets(m: dict[str, Any], interval: int) -> bool:
    return (
        m["precision"] is not None
        and m["precision"] >= 0.95
        and m["recall"] is not None
        and m["recall"] >= 0.90
        and m["clean_alerts"] == 0
        and m["median_delay"] is not None
        and m["median_delay"] <= 2 * interval
    )


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def _d(x: float | None) -> str:
    return "—" if x is None else f"{x:g}"


def rule_table(records: list[dict[str, Any]], names: list[str], interval: int) -> list[str]:
    head = (
        "| Rule | oracle-positive runs | alerts | TP | FP (premature) | FN | precision | recall | "
        "clean twins alerting (oracle-positive) | median / max steps onset→alert | targets |"
    )
    lines = [head, "|" + "---|" * 11]
    for name in names:
        m = score(records, name)
        lines.append(
            f"| {name} | {m['positives']} | {m['alerts']} | {m['tp']} | {m['fp']} ({m['premature']}) | "
            f"{m['fn']} | {_f(m['precision'])} | {_f(m['recall'])} | {m['clean_alerts']}/{m['clean_n']} "
            f"({m['clean_pos_alerts']}) | {_d(m['median_delay'])} / {_d(m['max_delay'])} | "
            f"{'met' if meets(m, interval) else 'missed'} |"
        )
    return lines


def fault_table(records: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| Fault | base | injection | claimed rule | oracle-positive seeds | rule fired (of positive) | "
        "median steps onset→alert |",
        "|---|---|---|---|---|---|---|",
    ]
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        if rec["fault"]:
            by_key[(rec["fault"], rec["base"])].append(rec)
    for fault in FAULTS:
        recs = by_key.get((fault.name, fault.base), [])
        for rule in fault.claims:
            pos = [r for r in recs if r["onsets"].get(rule) is not None]
            fired = [r for r in pos if r["verdicts"].get(rule, {}).get("status") == "IssuesFound"]
            delays = [r["verdicts"][rule]["iteration"] - r["onsets"][rule] for r in fired]
            lines.append(
                f"| {fault.name} | {fault.base} | {fault.what} | {rule} | {len(pos)}/{len(recs)} | "
                f"{len(fired)}/{len(pos)} | {_d(statistics.median(delays)) if delays else '—'} |"
            )
    return lines


def _what(details: str) -> str:
    """The measured part of a StatusDetails (after SageMaker's fixed sentence)."""
    text = details.split("condition being met. ", 1)[-1]
    return text.replace("|", "/")[:170]


def clean_table(records: list[dict[str, Any]]) -> list[str]:
    clean = [r for r in records if r["fault"] is None]
    bases = list(BASES)
    lines = [
        "| Rule | " + " | ".join(bases) + " | example (first clean twin that alerted) |",
        "|---|" + "---|" * (len(bases) + 1),
    ]
    for name in [*DEFAULT_RULES, *(label for label, _, _ in ALTERNATIVES)]:
        counts = []
        example = ""
        for base in bases:
            recs = [r for r in clean if r["base"] == base]
            hits = [r for r in recs if r["verdicts"].get(name, {}).get("status") == "IssuesFound"]
            counts.append(f"{len(hits)}/{len(recs)}")
            if hits and not example:
                v = hits[0]["verdicts"][name]
                example = f"{hits[0]['run']}, step {v['iteration']}: {_what(v['details'])}"
        if any(not c.startswith("0/") for c in counts):
            lines.append(f"| {name} | " + " | ".join(counts) + f" | {example} |")
    return lines


def render(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    records = sorted(records, key=lambda r: r["run"])
    interval = int(meta["tensor_interval"])
    n_clean = sum(1 for r in records if r["fault"] is None)
    n_fault = len(records) - n_clean
    metrics = {name: score(records, name) for name in DEFAULT_RULES}
    alt = {label: score(records, label) for label, _, _ in ALTERNATIVES}
    errors = sum(m["errors"] for m in metrics.values())
    out: list[str] = []
    w = out.append
    w("# Rule accuracy on labelled CPU training runs")
    w("")
    w(
        "Generated by `.venv/bin/python -m bench.accuracy` (about 7 minutes on 2 cores; `--quick` for a "
        "smoke run, `--results FILE` to keep the per-run records, `--from-results FILE` to re-render). "
        "Do not edit by hand: the text of the findings is in `bench/accuracy/findings.py`, the numbers "
        "come from the run."
    )
    w("")
    w(
        f"This run: {len(records)} runs ({n_fault} faulty, {n_clean} clean twins), {meta['seeds']} seeds, "
        f"{meta['jobs']} worker processes on {meta['cpus']} CPUs, {meta['wall_s']} s wall clock, "
        f"PyTorch {meta['torch']}; tensor collections saved every {interval} steps"
        + (" (the hook's default)." if meta.get("interval_is_default") else " (set with --tensor-interval).")
    )
    w("")
    from bench.accuracy.findings import findings

    w(findings(records, metrics, alt, interval))
    w("")
    w("## Results at default parameters")
    w("")
    w(
        "Every run is replayed with all 17 rules below at their defaults, and each rule is scored on every "
        "run (faulty and clean) against its own oracle. Targets: precision ≥ 0.95, recall ≥ 0.90, no alert "
        "on a "
        f"clean twin, median detection ≤ {2 * interval} steps (two save intervals) after onset."
    )
    w("")
    out.extend(rule_table(records, list(DEFAULT_RULES), interval))
    w("")
    if errors:
        w(f"{errors} rule evaluations ended in `Error`.")
        w("")
    w("### Extra columns: a different parameter (labelled; the defaults above are unchanged)")
    w("")
    out.extend(rule_table(records, [label for label, _, _ in ALTERNATIVES], interval))
    w("")
    w("### Thresholds beside SageMaker's and AUTOTRAINER's")
    w("")
    w("| Rule | trainguard default | SageMaker default | AUTOTRAINER / TheDeepChecker |")
    w("|---|---|---|---|")
    for name in DEFAULT_RULES:
        a, b, c = THRESHOLDS[name]
        w(f"| {name} | {a} | {b} | {c} |")
    w("")
    w("### Per fault: the claimed rules")
    w("")
    out.extend(fault_table(records))
    w("")
    w("### Alerts on clean twins, whole rule set at defaults")
    w("")
    w("Clean twins alerting, per base configuration (rules with no clean-twin alert are not listed):")
    w("")
    out.extend(clean_table(records))
    w("")
    w("## Method")
    w("")
    w(_METHOD)
    w("")
    w("### Base configurations (the clean twins)")
    w("")
    w("| Base | task | model | optimiser | steps | batch | train / val samples |")
    w("|---|---|---|---|---|---|---|")
    for name, cfg in BASES.items():
        model = (
            "CNN conv8-conv16-fc32"
            if cfg.arch == "cnn"
            else f"MLP {cfg.act} {'x'.join(map(str, cfg.hidden))}"
        )
        w(
            f"| {name} | {cfg.task} | {model} | {cfg.optimizer} lr {cfg.lr:g} | {cfg.steps} | {cfg.batch} | "
            f"{cfg.n_train} / {cfg.n_val} |"
        )
    w("")
    w("### Faults (each on 5 seeds; the clean twin is the base with the same seed)")
    w("")
    w("| Fault | base | injection | rules that claim it |")
    w("|---|---|---|---|")
    for fault in FAULTS:
        w(f"| {fault.name} | {fault.base} | {fault.what} | {', '.join(fault.claims)} |")
    w("")
    w("### Oracle: each rule's documented condition on the full tensors, every step")
    w("")
    w("| Rule | condition | must hold for (steps) |")
    w("|---|---|---|")
    for name in DEFAULT_RULES:
        w(f"| {name} | {ORACLE_TEXT[name]} | {PERSIST[name]} |")
    w("")
    w(
        "Hook configuration: `trainguard.Hook(job_dir, include_collections=[defaults..., "
        + ", ".join(EXTRA_COLLECTIONS)
        + "], rules=<the 17 rules>)` with the default save configuration (losses every step; tensors every "
        "10 steps of each mode); `register_module(model)`; the loss saved with `save_scalar('loss', loss, "
        "collections=['losses'])`; labels and predicted class ids with "
        "`save_tensor('labels'|'predictions', ...)`; "
        "an evaluation on the validation set every 5 steps in `EVAL` mode (loss, labels, predictions)."
    )
    w("")
    return "\n".join(out)


_METHOD = """\
Each run trains a small model on the CPU for 300 steps with mini-batches of 128, through the real
`trainguard.Hook` writing a local job folder, and then `trainguard.engine.replay.replay(LocalJob.open(dir),
rules=...)` evaluates that folder with the 17 model rules at their default parameters (the same
call `trainguard replay DIR --json` makes), plus the labelled alternatives.

Labels come from a symptom oracle inside the training loop, not from the injected cause: at every
step it computes each rule's documented condition from the full tensors (gradients after
`backward()`, parameters before and after `optimizer.step()`, activations captured by its own
forward hooks, the batch's inputs, labels and predictions, and the loss of the whole training and
validation sets at the current parameters, from an un-hooked copy of the model). A run is positive
for a rule when that condition holds for the number of consecutive steps in the table below; the
onset is the first of those steps. The rules see only what the hook saved
(statistics every save interval, losses every step), so the benchmark measures the whole pipeline:
sampling, statistics instead of full tensors, and each rule's reading of its definition.

Scoring, per rule over all runs (faulty and clean): a true positive is an oracle-positive run on
which the rule reported `IssuesFound` less than 10 steps before the onset or later; an alert 10 or more
steps before the onset is *premature* and counts as a false positive (and the run as missed); an
alert on an oracle-negative run is a false positive; delay = alert step - onset step, in training
steps (the replay's global step is mapped back to the training step: evaluations advance the hook's
global step too). Clean-twin alerts are counted separately: a clean twin is a run without an
injected fault, but the oracle may still find the symptom in it (in parentheses), which says the
documented condition itself flags healthy training."""
