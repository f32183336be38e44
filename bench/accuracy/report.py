"""Render docs/accuracy.md from an ``Evaluation`` (every number comes from the stored corpus)."""

# Markdown table rows and the page template read best one row per line.
# ruff: noqa: E501

from __future__ import annotations

import subprocess
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench.accuracy import labels as labelling
from bench.accuracy import plan
from bench.accuracy.evaluate import Evaluation, delay_budget, profiles
from bench.accuracy.score import Metrics, RuleConf, wilson
from bench.accuracy.tune import ADOPTED, DEFAULT_STANDINS, MIN_EVIDENCE_RUNS, NOT_ADOPTED, SCORED_RULES


def _git(*args: str) -> str:
    import trainguard

    try:
        out = subprocess.run(
            ["git", "-C", str(Path(trainguard.__file__).parent), *args],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    return out.stdout.strip() or f"unknown ({out.stderr.strip()[:80]})"


def _ratio(k: int, n: int) -> str:
    if n == 0:
        return "—"
    lo, hi = wilson(k, n) or (0.0, 0.0)
    return f"{k / n:.2f} [{lo:.2f}, {hi:.2f}] ({k}/{n})"


def _fa(m: Metrics) -> str:
    if not m.clean_runs:
        return "—"
    lo, hi = wilson(m.clean_alarms, m.clean_runs) or (0.0, 0.0)
    return f"{100 * m.clean_alarms / m.clean_runs:.1f} [{100 * lo:.1f}, {100 * hi:.1f}] ({m.clean_alarms}/{m.clean_runs})"


def _delay(m: Metrics, budget: int) -> str:
    if m.median_delay is None:
        return "—"
    return f"{m.median_delay:g} ({m.median_delay / (budget / 2):.1f} int.)"


def _met(m: Metrics, budget: int) -> str:
    meets = m.meets(budget)
    missing = [k.replace("_", " ") for k, v in meets.items() if v is False]
    unknown = [k.replace("_", " ") for k, v in meets.items() if v is None]
    if not missing and not unknown:
        return "**met**"
    parts = []
    if missing:
        parts.append("missed: " + ", ".join(missing))
    if unknown:
        parts.append("no data: " + ", ".join(unknown))
    return "; ".join(parts)


def _row(m: Metrics, budget: int, label: str | None = None) -> str:
    fp = ", ".join(f"{k} {v}" for k, v in sorted(m.fp_where.items())) or "0"
    return (
        f"| {label or m.label} | {m.tp + m.fn} | {_ratio(m.tp, m.tp + m.fp)} | {_ratio(m.tp, m.tp + m.fn)} | "
        f"{_fa(m)} | {fp} | {_delay(m, budget)} | {_met(m, budget)} |"
    )


HEADER = (
    "| Rule | positives | precision [95% CI] | recall [95% CI] | false alarms / 100 clean runs [95% CI] | "
    "false alarms by where | median delay, steps (save intervals) | targets |\n"
    "|---|---|---|---|---|---|---|---|"
)


def _table(ev: Evaluation, profile: str, split: str, confs: list[RuleConf]) -> str:
    budget = delay_budget({p.name: p for p in profiles()}[profile])
    rows = [HEADER]
    for conf in confs:
        rows.append(_row(ev.metrics(profile, split, conf), budget))
    return "\n".join(rows)


def _corpus_table(ev: Evaluation) -> str:
    counts: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for run in ev.runs:
        lab = ev.labels[run.run_id]
        key = (lab["split"], lab["family"])
        kind = (
            lab["kind"]
            if lab["kind"] != "fault"
            else {"harmful": "harmful", "unharmed": "near-miss"}.get(lab.get("harm", ""), "grey")
        )
        counts[key][kind] += 1
    lines = [
        "| split | family | clean | suboptimal (not scored) | faulty, harmful | faulty, near-miss (unharmed) | faulty, grey (not scored) |",
        "|---|---|---|---|---|---|---|",
    ]
    total: Counter[str] = Counter()
    for (split, family), c in sorted(counts.items(), key=lambda kv: (kv[0][0] != "dev", kv[0][1])):
        lines.append(
            f"| {split} | {family}{' (held out)' if family in plan.HELD_OUT_FAMILIES else ''} | {c['clean']} | "
            f"{c['suboptimal']} | {c['harmful']} | {c['near-miss']} | {c['grey']} |"
        )
        total += c
    lines.append(
        f"| **all** | | **{total['clean']}** | {total['suboptimal']} | **{total['harmful']}** | **{total['near-miss']}** | "
        f"{total['grey']} |"
    )
    return "\n".join(lines)


def _positives_table(ev: Evaluation, split: str) -> str:
    per: dict[str, Counter[str]] = defaultdict(Counter)
    for run in ev.runs:
        lab = ev.labels[run.run_id]
        if lab["split"] != split:
            continue
        for rule in lab.get("positive_for", []) or []:
            per[rule][lab["fault"]] += 1
    lines = ["| Rule | positive runs by fault |", "|---|---|"]
    for rule in SCORED_RULES:
        lines.append(f"| {rule} | {', '.join(f'{k} {v}' for k, v in sorted(per[rule].items())) or '—'} |")
    return "\n".join(lines)


def _evidence(ev: Evaluation, profile: str, split: str, confs: list[RuleConf], limit: int = 4) -> str:
    by_id = {r.run_id: r for r in ev.runs}
    out = []
    for conf in confs:
        m = ev.metrics(profile, split, conf)
        if not m.misses and not m.clean_alarms:
            continue
        reasons = Counter(j.reason for j in m.misses)
        by_fault = Counter(f"{ev.labels[j.run_id]['fault']}" for j in m.misses)
        where = ", ".join(f"{k} {v}" for k, v in sorted(m.fp_where.items())) or "none"
        lines = [
            f"**{conf.label}**: {m.fn} missed ({', '.join(f'{k} {v}' for k, v in reasons.most_common()) or 'none'}; "
            f"by fault: {', '.join(f'{k} {v}' for k, v in by_fault.most_common()) or '—'}), "
            f"{m.fp} false alarms ({where})."
        ]
        for j in m.misses[:limit]:
            lab = ev.labels[j.run_id]
            spec = by_id[j.run_id].spec
            saw = j.details.replace("|", "/")[:260] or "(no details)"
            lines.append(
                f"- miss `{j.run_id}` ({spec.fault} grade {spec.grade}, {spec.params}, switched on at step "
                f"{lab['inject_step']}, symptom from step {lab['onset_step']} ({lab['onset_method']}), "
                f"outcome {_outcome(lab)}; {_saves_after(profile, lab['onset_step'])} saved tensor steps after it): "
                f"{j.reason}{f' at step {j.alert}' if j.alert is not None else ''}: {saw}"
            )
        if len(m.misses) > limit:
            lines.append(
                f"- ... {len(m.misses) - limit} more misses: {', '.join(j.run_id for j in m.misses[limit : limit + 12])}"
            )
        clean_fa = [j for j in m.false_alarms if j.where == "clean"]
        for j in clean_fa[: max(1, limit // 2)]:
            lines.append(
                f"- false alarm on clean `{j.run_id}` at step {j.alert}: {j.details.replace('|', '/')[:220]}"
            )
        out.append("\n".join(lines))
    return "\n\n".join(out)


def _saves_after(profile: str, onset: int) -> int:
    """TRAIN steps with tensor statistics the profile saves from ``onset`` to the run's end."""
    interval = delay_budget({p.name: p for p in profiles()}[profile]) // 2
    return len(range(-(-onset // interval) * interval, plan.STEPS, interval))


def _outcome(lab: dict[str, Any]) -> str:
    if lab.get("diverged"):
        return "diverged"
    lost, dacc = lab.get("lost_reduction"), lab.get("delta_acc")
    if lost is None:
        return lab.get("harm", "?")
    return f"{lost:+.0%} of the twin's loss reduction lost, accuracy {dacc:+.3f}"


def _tuned_names(ev: Evaluation, rule: str) -> list[str]:
    """The parameters any scored configuration of ``rule`` sets, in a stable order."""
    names: list[str] = []
    for conf in ev.confs[rule]:
        for k, _ in conf.params:
            if k not in names:
                names.append(k)
    sagemaker = ev.sagemaker_of(rule)
    for k, _ in sagemaker.params if sagemaker is not None else ():
        if k not in names:
            names.append(k)
    return names


def _values(rule: str, names: list[str], conf: RuleConf | None = None) -> str:
    """``name=value`` for each of ``names``: ``conf``'s value, else the rule module's default."""
    from trainguard.rules.catalog import sagemaker_string
    from trainguard.rules.registry import RULES

    fields = RULES[rule].Config.model_fields
    given = dict(conf.params) if conf is not None else {}
    out = []
    for name in names:
        value = given.get(name, sagemaker_string(fields[name].default) if name in fields else "?")
        out.append(f"`{name}={value}`")
    return ", ".join(out) or "(no parameters)"


def _sagemaker_values(ev: Evaluation, rule: str, names: list[str]) -> str:
    from trainguard.rules.catalog import DEPARTURES, NOT_SAGEMAKER, TRAINGUARD_ONLY

    if rule in TRAINGUARD_ONLY:
        return "not a SageMaker rule"
    departures = DEPARTURES.get(rule, {})
    conf = ev.sagemaker_of(rule)
    given = dict(conf.params) if conf is not None else {}
    out = []
    for name in names:
        if name in given:
            out.append(f"`{name}={given[name]}`")
        elif name in departures:
            value = departures[name][0]
            out.append(f"`{name}`: {'not a SageMaker parameter' if value == NOT_SAGEMAKER else value}")
        else:
            out.append(f"`{name}`: same")
    return ", ".join(out) or "same"


def _why(ev: Evaluation, rule: str, budget: int) -> str:
    from bench.accuracy.tune import MIN_EVIDENCE_RUNS, _rank, evidence

    default = ev.confs[rule][0]
    dm = ev.metrics("trainguard", "dev", default)
    chosen = ev.chosen(rule)
    if chosen.label != default.label:
        gain = evidence(chosen, dm)
        return (
            f"{_params(ev.conf_by_label(chosen.label))}: on dev {chosen.tp - dm.tp:+d} true positives, "
            f"{chosen.fp - dm.fp:+d} false alarms ({chosen.clean_alarms - dm.clean_alarms:+d} on clean runs), net {gain:+d} runs"
        )
    others = [ev.metrics("trainguard", "dev", c) for c in ev.confs[rule][1:]]
    if not others:
        return "keep the default (no candidate)"
    best = min(others, key=lambda m: _rank(m, budget))
    if _rank(best, budget) >= _rank(dm, budget):
        return "keep the default: no candidate ranks better on dev"
    return (
        f"keep the default: the best-ranked candidate ({best.label.split('[', 1)[-1].rstrip(']')}) "
        f"is better by {evidence(best, dm):+d} runs on dev (< {MIN_EVIDENCE_RUNS} needed)"
    )


def _defaults_table(ev: Evaluation) -> str:
    tg = delay_budget({p.name: p for p in profiles()}["trainguard"])
    lines = [
        "| Rule | trainguard's default | SageMaker's default | dev: trainguard's / SageMaker's, P / R / FA per 100 / delay | dev choice, and why | test: trainguard's default | test: SageMaker's default | test: dev choice | test targets (dev choice) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rule in SCORED_RULES:
        default = ev.confs[rule][0]
        names = _tuned_names(ev, rule)
        sagemaker = ev.sagemaker_of(rule)
        dm = ev.metrics("trainguard", "dev", default)
        dsm = ev.metrics("trainguard", "dev", sagemaker) if sagemaker is not None else None
        chosen = ev.conf_by_label(ev.chosen(rule).label)
        tm = ev.metrics("trainguard", "test", default)
        tsm = ev.metrics("trainguard", "test", sagemaker) if sagemaker is not None else None
        tc = ev.metrics("trainguard", "test", chosen)
        same_as_tg = "same as trainguard's" if sagemaker is None else _short(tsm, tg) if tsm else "—"
        lines.append(
            f"| {rule} | {_values(rule, names)}{' (no default: a stand-in)' if rule in DEFAULT_STANDINS else ''} | "
            f"{_sagemaker_values(ev, rule, names)} | {_short(dm, tg)} / {_short(dsm, tg) if dsm else '='} | "
            f"{_why(ev, rule, tg)} | {_short(tm, tg)} | {same_as_tg} | "
            f"{'(the default)' if chosen.key == default.key else _short(tc, tg)} | {_met(tc, tg)} |"
        )
    return "\n".join(lines)


def _params(conf: RuleConf) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in conf.params)


def _short(m: Metrics, budget: int | None = None) -> str:
    def f(x: float | None) -> str:
        return "—" if x is None else f"{x:.2f}"

    fa = "—" if m.fa_per_100 is None else f"{m.fa_per_100:.1f}"
    text = f"{f(m.precision)} / {f(m.recall)} / {fa}"
    if budget is not None:
        text += f" / {'—' if m.median_delay is None else f'{m.median_delay:g}'}"
    return text


def _candidates_appendix(ev: Evaluation) -> str:
    tg = delay_budget({p.name: p for p in profiles()}["trainguard"])
    out = []
    for rule in SCORED_RULES:
        rows = [f"**{rule}** (dev split, trainguard profile)", "", HEADER]
        ranked = sorted(
            (ev.metrics("trainguard", "dev", c) for c in ev.confs[rule]),
            key=lambda m: (m.fa_per_100 or 0.0, -(m.recall or 0.0)),
        )
        rows += [_row(m, tg) for m in ranked]
        out.append("\n".join(rows))
    return "\n\n".join(out)


def render(ev: Evaluation, meta: dict[str, Any]) -> str:
    defaults = [ev.confs[r][0] for r in SCORED_RULES]
    tg, sm, eval1 = profiles()
    budget = delay_budget(tg)
    test_metrics = [ev.metrics("trainguard", "test", c) for c in defaults]
    met = [m.label for m in test_metrics if m.all_met(budget)]
    chosen_confs = [ev.conf_by_label(ev.chosen(r).label) for r in SCORED_RULES]
    chosen_met = [c.label for c in chosen_confs if ev.metrics("trainguard", "test", c).all_met(budget)]
    sagemaker_confs = [c for c in (ev.sagemaker_of(r) for r in SCORED_RULES) if c is not None]
    branch = _git("rev-parse", "--abbrev-ref", "HEAD")
    commit = _git("log", "-1", "--format=%h %s")
    dirty = _git("status", "--porcelain", "--", ".")
    return f"""# Rule accuracy: benchmark v2

Generated by `make bench-accuracy` (`python -m bench.accuracy all`: trains what the corpus
cache lacks, then scores) or `python -m bench.accuracy score` (rescoring the stored runs
only: minutes, no training; run it after any change to the rules); do not edit by hand (the
method is in `bench/accuracy/*.py`, every number comes from the runs). Rules scored: trainguard at branch `{branch}`, commit {commit}{" (with uncommitted changes)" if dirty and not dirty.startswith("unknown") else ""};
verdict fingerprint `{ev.fingerprint}`.{meta.get("scoring_note", "")}

**At trainguard's defaults, {len(met)} of {len(defaults)} rules meet every target on the test split**{": " + ", ".join(met) if met else ""}.
With the defaults the dev split supports (chosen on dev only, below), {len(chosen_met)} of {len(defaults)} do{": " + ", ".join(chosen_met) if chosen_met else ""}.
Targets on the test split: precision ≥ 0.95, recall ≥ 0.90, ≤ 1 false alarm per 100 clean
runs, median detection delay ≤ 2 save intervals ({budget} training steps at trainguard's
defaults; {delay_budget(sm)} at SageMaker's).

Headline, test split, trainguard's save defaults: each rule at trainguard's default and at
SageMaker's documented defaults given explicitly (an explicitly given SageMaker parameter
keeps its documented meaning). P = precision, R = recall, FA = false alarms per 100 clean
runs (alerts on clean twins), delay = median training steps after the symptom's onset.

{_headline_table(ev)}

{_adopted()}

## The corpus

Every run is trained once through the public `trainguard.Hook` (its PyTorch integration,
`register_module` and `register_loss`, or `TrainguardCallback` for XGBoost), recording
every statistic the hook can compute: losses every step; tensor statistics every
{plan.TRAIN_RECORD_INTERVAL} TRAIN steps and every EVAL step. The corpus lives outside git
(`{meta.get("cache", "")}`); a scoring replays each stored run with `trainguard.engine.replay`
through a job that keeps only what a save configuration would have saved, so any rule
configuration and any save profile whose intervals are multiples of {plan.TRAIN_RECORD_INTERVAL}
can be scored without training again.

{_corpus_table(ev)}

Families: tabular MLP (ReLU and tanh; 16 raw features of mixed scale, standardised by the
pipeline), CNN on synthetic 32x32 RGB shape images, LSTM and a one-layer transformer on
padded token sequences (pad id 0), a residual network with BatchNorm on the images (test
split only: no default was chosen on it), XGBoost on the tabular teacher's data. Synthetic
data only, generated per seed. {plan.STEPS} training steps per PyTorch run (evaluation every
{plan.EVAL_EVERY} steps, {plan.EVAL_BATCHES} EVAL batches over the validation set),
{plan.XGB_ROUNDS} boosting rounds per XGBoost run.

The sweep: every optimizer (SGD, SGD with momentum 0.9, Adam, AdamW, RMSprop) at two
learning rates, with schedules (constant, cosine, step decay) and weight decay assigned in
rotation; XGBoost over depth, learning rate and subsampling. Splits: dev seeds
{plan.SPLIT_SEEDS["dev"]}, test seeds {plan.SPLIT_SEEDS["test"]} plus the held-out family.

Faults (cause, three severities, the mildest meant as a near-miss; switched on at a random
step in 10-70% of the run, initialisation and XGBoost configuration faults at step 0):

{_faults_table()}

## How runs are labelled (cause and outcome; no rule is consulted)

- Losses are compared by the learning they keep: the reduction of the final validation loss
  below chance, ln(classes).
- **Clean**: a sweep run that keeps at least {1 - labelling.CLEAN_MARGIN:.0%} of the reduction reached by its
  family's best configuration (lowest mean final validation loss over the split's seeds) on the
  same seed, with accuracy within {labelling.CLEAN_ACC_POINTS * 100:.0f} points. Other sweep runs are *suboptimal* and not scored.
- **Faulty**: compared with its clean twin (same configuration and seed; identical until the
  switch-on). *Harmful* when it diverged, or lost more than {labelling.HARM_LOSS:.0%} of the twin's
  reduction, or more than {labelling.HARM_ACC * 100:.0f} accuracy points; a *near-miss* (a negative) when it lost at most
  {labelling.NEAR_LOSS:.0%} and {labelling.NEAR_ACC * 100:.0f} point; otherwise grey (not scored).
- **Who should fire**: on a harmful run, the rules whose documented purpose is that cause
  (table above); rules listed as tolerated may fire without a false alarm (a consequence,
  e.g. the loss stops decreasing after the learning rate went to 0); on a diverged run any
  rule may. Every alert on a clean run, a near-miss, or another fault's harmful run is a false
  alarm; so is an alert before the switch-on (the run equalled its twin then), which also
  makes a positive run a miss.
- **Symptom onset from effect sizes**: the first step at or after the switch-on where one
  of the fault's signals (the bench's own measurements: loss, gradient norms, update ratio,
  dead-unit share, input statistics, label shares, padding share, train-validation gap)
  differs from the twin's by ≥ {labelling.EFFECT:g} robust standard deviations of the twin's own
  fluctuation (1.4826 x MAD around an 11-step running median), for {labelling.SUSTAIN} consecutive
  measurements ({labelling.SUSTAIN_EVAL} evaluations); per-batch signals are first averaged over a trailing
  {labelling.SMOOTH_STEPS}-step window. Without such a step, the switch-on step (a fallback, counted in the table below).
  Delay = alert step - onset, in training steps (an alert between switch-on and onset counts 0).
- Applicability: CheckInputImages is scored on image families, NLPSequenceRatio on sequence
  families, the tree rules on XGBoost, the other rules on the PyTorch families.

Positives per rule on the test split: {_positives_table(ev, "test")}

## Test split, trainguard's default save configuration, rules at their defaults

{tg.description}.

{_table(ev, "trainguard", "test", defaults)}

## Test split, trainguard's default save configuration, SageMaker's parameter defaults

The rules whose SageMaker defaults differ from trainguard's, given SageMaker's documented
defaults explicitly (read from `trainguard.rules.catalog.DEPARTURES`, what `trainguard rules`
shows as SageMaker's default); the other rules' SageMaker defaults are trainguard's.

{_table(ev, "trainguard", "test", sagemaker_confs)}

{_sagemaker_notes(ev)}

## Test split, SageMaker's 500-step save configuration, rules at their defaults

{sm.description}: on these {plan.STEPS}-step runs a rule sees TRAIN steps 0 and 500 and the
first evaluation step only.

{_table(ev, "sagemaker", "test", defaults)}

{_eval1_section(ev, eval1, defaults)}

## Defaults the dev split supports

Chosen on the dev split at trainguard's save defaults among the rule's default, SageMaker's
defaults and the candidates in `bench/accuracy/tune.py` (targets met first; then ≤ 1 false
alarm per 100 clean runs; then recall, precision, false alarms, delay), then reported on the
test split. Conservative: the best-ranked configuration replaces the default only when it is
better on dev by at least {MIN_EVIDENCE_RUNS} runs (true positives gained plus false alarms
avoided), or reaches the false-alarm target the default misses with at least that many fewer
alarms on clean runs. "P / R / FA per 100 / delay" in each cell; "—" where there is nothing
to measure (no positives, or no alert to time).

{_defaults_table(ev)}

Test split with the chosen configurations:

{_table(ev, "trainguard", "test", chosen_confs)}

## Misses and false alarms, with evidence (test split, trainguard profile, defaults)

{_evidence(ev, "trainguard", "test", defaults)}

## Appendix: every configuration on the dev split

{_candidates_appendix(ev)}
{_skipped(ev)}
"""


def render_dev_choices(ev: Evaluation) -> str:
    """The dev split's choice per rule (``python -m bench.accuracy tune``; the test split unread)."""
    tg = delay_budget({p.name: p for p in profiles()}["trainguard"])
    lines = [
        "| Rule | trainguard's default | SageMaker's default | dev: default / SageMaker's, P / R / FA per 100 / delay | dev choice, and why |",
        "|---|---|---|---|---|",
    ]
    for rule in SCORED_RULES:
        names = _tuned_names(ev, rule)
        sagemaker = ev.sagemaker_of(rule)
        dm = ev.metrics("trainguard", "dev", ev.confs[rule][0])
        dsm = ev.metrics("trainguard", "dev", sagemaker) if sagemaker is not None else None
        lines.append(
            f"| {rule} | {_values(rule, names)} | {_sagemaker_values(ev, rule, names)} | "
            f"{_short(dm, tg)} / {_short(dsm, tg) if dsm else '='} | {_why(ev, rule, tg)} |"
        )
    return "\n".join(lines) + "\n\n" + _candidates_appendix(ev) + "\n"


def _eval1_section(ev: Evaluation, eval1: Any, defaults: list[RuleConf]) -> str:
    head = "## Test split, trainguard's defaults with every EVAL step saved, rules at their defaults\n\n"
    if not ev.verdicts.get("trainguard-eval1"):
        return (
            head + "Not scored in this run (`python -m bench.accuracy score --eval-every-step` adds it): "
            "it replays every run a third time at full length."
        )
    return (
        head + f"{eval1.description}. Not a shipped configuration: it shows what the rules that judge "
        "evaluation data (Confusion, ClassImbalance's misprediction branch; Overfit's EVAL losses are "
        "saved every step already) would see if the hook saved labels and predictions at every EVAL "
        "step, which costs little because evaluations are short.\n\n"
        + _table(ev, "trainguard-eval1", "test", defaults)
    )


def _headline_table(ev: Evaluation) -> str:
    tg = delay_budget({p.name: p for p in profiles()}["trainguard"])
    lines = [
        "| Rule | trainguard's default: P / R / FA / delay | SageMaker's default: P / R / FA / delay | targets at trainguard's default |",
        "|---|---|---|---|",
    ]
    for rule in SCORED_RULES:
        m = ev.metrics("trainguard", "test", ev.confs[rule][0])
        sagemaker, note = ev.sagemaker.get(rule, (None, ""))
        if sagemaker is not None:
            theirs = _short(ev.metrics("trainguard", "test", sagemaker), tg)
        elif note == "not a SageMaker rule":
            theirs = "not a SageMaker rule"
        else:
            theirs = "same parameters"
        lines.append(f"| {rule} | {_short(m, tg)} | {theirs} | {_met(m, tg)} |")
    return "\n".join(lines)


def _adopted() -> str:
    rows = "\n".join(f"- **{rule}**: {text}" for rule, text in ADOPTED.items())
    text = (
        f"Changed in the rule modules on the dev split's evidence (the tables score the new defaults; SageMaker's are scored beside them):\n\n{rows}"
        if ADOPTED
        else "No rule's default was changed on this benchmark's evidence."
    )
    if NOT_ADOPTED:
        kept = "\n".join(f"- **{rule}**: {why}" for rule, why in NOT_ADOPTED.items())
        text += f"\n\nDev-split choices not adopted as defaults, and open findings:\n\n{kept}"
    return text


def _sagemaker_notes(ev: Evaluation) -> str:
    notes = [
        f"- {rule}: {note}"
        for rule in SCORED_RULES
        for conf, note in [ev.sagemaker.get(rule, (None, ""))]
        if note
    ]
    return (
        "Parameters left at trainguard's value in these rows, and why:\n\n" + "\n".join(notes)
        if notes
        else ""
    )


def _skipped(ev: Evaluation) -> str:
    if not ev.skipped:
        return ""
    return (
        "\nCandidates the installed rules do not accept (skipped):\n\n"
        + "\n".join(f"- {s}" for s in ev.skipped)
        + "\n"
    )


def _faults_table() -> str:
    lines = [
        "| fault | cause | severities (mild, medium, severe) | families | rules that should fire | tolerated |",
        "|---|---|---|---|---|---|",
    ]
    for f in plan.FAULTS:
        detects = ", ".join(f.detects) + (
            f" (+ {', '.join(f.detects_if_diverged)} when it diverged)" if f.detects_if_diverged else ""
        )
        lines.append(
            f"| {f.name} | {f.what} | {'; '.join(', '.join(f'{k} {v}' for k, v in g.items()) for g in f.grades)} | "
            f"{', '.join(f.families)} | {detects or '—'} | {', '.join(f.tolerated) or '—'} |"
        )
    return "\n".join(lines)
