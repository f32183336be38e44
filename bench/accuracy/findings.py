"""The findings section of docs/accuracy.md: fixed explanations around the measured numbers.

Every number here is computed from the run's records, so a rerun updates it; the wording
describes mechanisms that were checked by reading the alerts' StatusDetails.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

Record = dict[str, Any]
Verdict = dict[str, Any]


def _alerts(records: list[Record], config: str, where: Callable[[Record, Verdict], bool]) -> int:
    return sum(
        1
        for r in records
        if r["verdicts"].get(config, {}).get("status") == "IssuesFound" and where(r, r["verdicts"][config])
    )


def _says(*texts: str) -> Callable[[Record, Verdict], bool]:
    return lambda r, v: any(t in v["details"] for t in texts)


def _oracle_negative(rule: str) -> Callable[[Record, Verdict], bool]:
    return lambda r, v: r["onsets"].get(rule) is None


def _p(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def _line(m: dict[str, Any]) -> str:
    delay = "—" if m["median_delay"] is None else f"{m['median_delay']:g}"
    return (
        f"precision {_p(m['precision'])}, recall {_p(m['recall'])}, "
        f"{m['clean_alerts']}/{m['clean_n']} clean twins alerting, median delay {delay} steps"
    )


def _median(values: list[int]) -> str:
    return f"{statistics.median(values):g}" if values else "—"


def _delays(records: list[Record], config: str, fault: str) -> list[int]:
    rule = config.split("[", 1)[0]
    return [
        r["verdicts"][config]["iteration"] - r["onsets"][rule]
        for r in records
        if r["fault"] == fault
        and r["verdicts"][config]["status"] == "IssuesFound"
        and r["onsets"].get(rule) is not None
    ]


def findings(records: list[Record], metrics: dict[str, Any], alt: dict[str, Any], interval: int) -> str:
    from bench.accuracy.score import meets

    met = [n for n, m in metrics.items() if meets(m, interval)]
    missed = [n for n, m in metrics.items() if not meets(m, interval)]
    clean = [r for r in records if r["fault"] is None]
    n_clean = len(clean)
    n_sig = sum(1 for r in clean if r["base"] == "circles-sigmoid")
    near = [
        n
        for n in ("VanishingGradient", "GradientNormRatio", "DeadRelu", "WeightUpdateRatio")
        if metrics[n]["fp"] or metrics[n]["fn"]
    ]
    late = sum(
        1
        for name in near
        for r in records
        if r["onsets"].get(name) is not None
        and r["onsets"][name] >= r.get("steps", 300) - interval
        and r["verdicts"][name]["status"] != "IssuesFound"
    )
    near_fn = sum(metrics[n]["fn"] - metrics[n]["premature"] for n in near)
    near_prem = sum(metrics[n]["premature"] for n in near)
    lnd_train = "LossNotDecreasing[mode=TRAIN]"
    lnd_inc = _alerts(clean, lnd_train, _says("increase_threshold"))
    lnd_not_lower = _alerts(clean, lnd_train, _says("not lower"))
    ot = metrics["Overtraining"]
    ot_train = _alerts(records, "Overtraining", _says("training (TRAIN)"))
    ot_steps = [
        r["verdicts"]["Overtraining"]["iteration"]
        for r in clean
        if r["verdicts"]["Overtraining"]["status"] == "IssuesFound"
    ]
    conf_step0 = _alerts(records, "Confusion", lambda r, v: v["iteration"] == 0)
    ci = metrics["ClassImbalance"]
    ci_clean_mis = _alerts(clean, "ClassImbalance", _says("mispredicted"))
    ci_fault = [r for r in records if r["fault"] == "class-imbalance"]
    ci_fault_ratio = _alerts(ci_fault, "ClassImbalance", _says("ratio"))
    ci_circles = [r for r in ci_fault if r["base"] == "circles-relu"]
    ci_circles_delay = _median(_delays(ci_circles, "ClassImbalance", "class-imbalance"))
    az = metrics["AllZero"]
    az_pred = _alerts(
        records, "AllZero", lambda r, v: "of predictions" in v["details"] and r["onsets"]["AllZero"] is None
    )
    ut = metrics["UnchangedTensor"]
    ut_lab = _alerts(
        records,
        "UnchangedTensor",
        lambda r, v: _says("labels (", "predictions (")(r, v) and _oracle_negative("UnchangedTensor")(r, v),
    )
    pwi = metrics["PoorWeightInitialization"]
    pwi_spread = _alerts(clean, "PoorWeightInitialization", _says("spread"))
    pwi_lr0 = [r for r in records if r["fault"] in ("lr-zero", "lr-tiny")]
    pwi_lr0_hit = _alerts(pwi_lr0, "PoorWeightInitialization", lambda r, v: True)
    wur_first = _alerts(records, "WeightUpdateRatio", lambda r, v: v["step"] is not None and v["step"] <= 5)
    cii, cii_alt = metrics["CheckInputImages"], alt["CheckInputImages[regex=.*model_input_0]"]
    lnd = metrics["LossNotDecreasing"]
    out = [
        "## Findings",
        "",
        f"At default parameters **{len(met)} of {len(metrics)} rules meet every target**: "
        + (", ".join(met) or "none")
        + f". The other {len(missed)} miss at least one ({', '.join(missed)}). Most misses are not "
        "implementation defects: the rule's documented condition, read with trainguard's defaults "
        f"(losses every step, tensor statistics every {interval} steps) on mini-batch training, fires on "
        "healthy runs or reads a noisy signal. The hook's default tensor interval changed from 10 to 50 "
        "while this benchmark was written (shared/trainguard/hook/config.py); runs are 300 steps so that "
        "each one has six tensor saves, and the delay target (two intervals) is now 100 steps. "
        "`--tensor-interval 10` reruns everything at the old interval.",
        "",
        "1. **Rules that work at defaults.** "
        + "; ".join(f"{n}: {_line(metrics[n])}" for n in met)
        + ". Each injected symptom is there from step 0 or persists once it appears, so the first "
        "saved step after onset catches it (WeightUpdateRatio's first comparable pair is step 0 against "
        f"the first evaluation's weights at global step 5, where {wur_first} of its alerts land).",
    ]
    if near:
        out.append(
            f"2. **Small misses of {', '.join(near)}**: {near_prem} premature alerts and {near_fn} missed "
            "run(s) in all. The premature ones "
            "are intermittent symptoms the rule saw on one saved batch before the oracle's 10-step "
            "persistence: in the batch-8 oscillating runs a layer's gradient is exactly 0 on some "
            "batches long before it stays below 1e-7; in the 40-sample overfit runs a memorised "
            "training set drives one layer's mean gradient just under 1e-7 at a saved step. Of the "
            f"misses, {late} have their onset in the last save interval of the run (no saved step "
            f"left to see it); the rest are episodes shorter than the {interval}-step interval (a CNN "
            "layer more than half dead for a few dozen steps early in training), which a sparser "
            "interval cannot see."
        )
    out += [
        f"3. **CheckInputImages never fires at its default regex** (recall {_p(cii['recall'])} on "
        f"{cii['positives']} runs with un-normalised inputs): `.*hybridsequential0_input_0` is MXNet "
        "Gluon's name for a model input, and the PyTorch hook writes `model_input_0`. The job reports "
        'NoIssuesFound, not "no matching tensor", so a user cannot tell the rule saw nothing. With '
        f"`regex=.*model_input_0` (extra column): {_line(cii_alt)}; the alert waits for 500 images, "
        "which the first evaluation (500 validation images at step 4) provides.",
        "4. **LossNotDecreasing** at defaults (`mode` None) reads the EVAL loss whenever the job saves "
        "one, and `num_steps` 10 then means 10 evaluations (50 training steps here): on the lr-zero and "
        f"lr-tiny runs it fires {_median(_delays(records, 'LossNotDecreasing', 'lr-zero'))} steps after "
        f"onset. Overall {_line(lnd)}; {lnd['clean_pos_alerts']} of its {lnd['clean_alerts']} clean-twin "
        "alerts are converged runs whose validation loss has plateaued or crept up, which the oracle "
        "(the same condition on the whole training-set loss) also flags. With `mode=TRAIN` (extra "
        "column) it compares single mini-batch losses, and batch noise decides: "
        f'{_line(alt[lnd_train])}; on clean twins {lnd_not_lower} alerts were "not lower than 10 steps '
        f'earlier" and {lnd_inc} were `increase_threshold_percent` 5 (the lowest mini-batch loss so far '
        "is a lucky batch, and 5% above it is ordinary noise). Neither setting meets the targets on "
        "mini-batch training; comparing window means instead of single losses might, but that changes "
        "the definition (not measured).",
        f"5. **Overtraining fires on {ot['alerts']} of {len(records)} runs** ({ot_train} by the training "
        f"branch; on clean twins at a median step of {_median(ot_steps)}). `delta` 0.1 is absolute and "
        "`patience_train` 5 counts saved steps: at SageMaker's old 500-step default interval that was "
        "2500 training steps; with losses saved every step it is 5 steps in which the loss must drop by "
        f"0.1. The oracle, with the same condition on the whole training-set loss, flags "
        f"{ot['clean_pos_alerts']} of {n_clean} clean twins too: the default is wrong for per-step "
        "losses, not the rule's reading of it.",
        f"6. **Confusion fires at step 0 on {conf_step0} of {len(records)} runs**, clean twins included: "
        "an untrained model's confusion matrix fails min_diag 0.9 (documented in the rule). Its precision "
        "and recall of 1.00 are empty, since the oracle with the same definition is positive at step 0 on "
        "every run. It needs EVAL-only data or a start step, which SageMaker's parameter list lacks.",
        f"7. **ClassImbalance** catches the injected imbalance ({ci_fault_ratio} of {len(ci_fault)} "
        "class-imbalance runs, by the count ratio) but also fires on "
        f"{ci['clean_alerts']} of {n_clean} clean twins, {ci_clean_mis} of them by the misprediction "
        "branch: the first 500 labels come from the untrained model (step 0 and the first evaluation) "
        "and the counts accumulate over the whole job, so an early alert is certain whenever the initial "
        f"model favours one class. {_line(ci)}. On the circles task the ratio alert waits for the second "
        f"TRAIN save to pass 500 labels (median delay {ci_circles_delay} steps).",
        f"8. **AllZero reads every saved tensor by default, predictions included**: {az_pred} of its "
        f"{az['fp']} false positives are a `predictions` tensor (class ids) that is all 0 because the "
        f"model predicts class 0 for the whole batch early in training ({az['clean_alerts']} of {n_clean} "
        "clean twins). Restricted to `collection_names=weights,biases,gradients,relu_output` (extra "
        f"column): {_line(alt['AllZero[collection_names=weights,biases,gradients,relu_output]'])}.",
        f"9. **UnchangedTensor reads every saved tensor by default** and compares a fingerprint (min, max, "
        f"mean, L2), not the values: {ut_lab} of its {ut['fp']} false positives are `labels` or "
        "`predictions` (after a NaN the argmax is class 0 at every step; class-id batches whose counts "
        "repeat have the same fingerprint). Restricted to `collection_names=weights,biases` (extra "
        f"column): {_line(alt['UnchangedTensor[collection_names=weights,biases]'])}. Its delay is the "
        f"definition: 3 saved steps span {2 * interval} steps, and the oracle's onset is after 20 "
        "unchanged steps.",
        f"10. **Overfit** compares the mean of the last 5 mini-batch TRAIN losses with the EVAL loss, and "
        "`ratio_threshold` 0.1 is relative: at losses near 0.1 a 0.01 gap is enough. "
        f"{_line(metrics['Overfit'])}; the whole-set oracle flags {metrics['Overfit']['clean_pos_alerts']} "
        "of those clean twins too (a 10% relative gap is normal late in healthy training). With "
        f"`patience=3` (extra column): {_line(alt['Overfit[patience=3]'])}.",
        "11. **OscillatingLoss** (AUTOTRAINER's 0.03 / 20%) reads the mini-batch TRAIN loss, whose "
        "batch-to-batch noise at batch 128 reverses by more than 0.03 in a fifth of the steps: "
        f"{_line(metrics['OscillatingLoss'])}. AUTOTRAINER applies the same numbers to per-epoch "
        "evaluation metrics, which are smooth. On the EVAL loss (`mode=EVAL`, extra column): "
        f"{_line(alt['OscillatingLoss[mode=EVAL]'])}; its false positives are runs whose validation loss "
        "swings while the whole training loss does not.",
        f"12. **PoorWeightInitialization**: `distribution_range` 0.001 is absolute, and a sigmoid MLP's "
        f"first-layer gradients are smaller than that at initialisation ({pwi_spread} of {n_sig} clean "
        "sigmoid twins alert on the p95-p5 spread; the oracle agrees, so the threshold, not the reading, "
        "flags a healthy network). The loss branch reads mini-batch losses over the first 10 step "
        "objects (evaluations count as steps), so with a learning rate of 0 a lucky batch resets its "
        f"patience: {pwi_lr0_hit} of {len(pwi_lr0)} lr-zero / lr-tiny runs alert. {_line(pwi)}.",
        "",
        "**Rule bugs.** None found: every alert and miss above follows the rule's docstring. Two "
        "behaviours for the rule owners to decide on: CheckInputImages reports NoIssuesFound when its "
        "regex matches no tensor (finding 3); and with `register_loss` the `predictions` tensor is the "
        "loss's first input (logits, N x C), which Confusion (no `argmax` parameter) skips and "
        "ClassImbalance (`argmax` False) cannot use for mispredictions (the lengths differ). That is read "
        "from the code, not measured: this benchmark saves predicted class ids explicitly.",
        "",
        "**Limits of this benchmark.** The oracle computes each rule's own documented condition, so "
        "precision and recall measure the pipeline (sampling, statistics instead of tensors, each "
        "rule's reading) against the definition; whether the definition is useful shows in the "
        "clean-twin column. The three circles bases share data and mini-batch order per seed, so their "
        "clean twins are not independent. Runs are 300 steps of tiny models; rules with long windows "
        "(Overtraining's validation patience, LossNotDecreasing on EVAL) get few chances.",
    ]
    return "\n".join(out)
