"""Score rule configurations by replaying stored runs: verdicts (cached), judgements, metrics.

A verdict is what ``trainguard.engine.replay`` says about one rule configuration on one
stored run under one emulated save profile (``corpus.EmulatedJob``). Verdicts are cached
under ``scores/<fingerprint>/<profile>/<run_id>.json``, keyed by the configuration; the
fingerprint hashes the source of the rules, the engine, the format and the hook's save
defaults (and the emulation), so any change there rescores from scratch, and a new
candidate configuration costs only its own replays.

Judging (per rule configuration and run, from ``labels.json``; see ``labels.py``):

* a positive run (harmful, and the rule is among the fault's ``detects``): an alert at or
  after the fault's switch-on step is a true positive, with delay = alert step - symptom
  onset (training steps); an alert before it fired on the healthy prefix: a false alarm
  *and* a miss; no alert (or an ``Error``) is a miss, kept with its evidence;
* a harmful run the rule is ``tolerated`` on: ignored, except an alert before the switch-on;
* every other run (clean, unharmed near-miss, another fault's harmful run): an alert is a
  false alarm;
* runs labelled suboptimal or grey, and families the rule cannot read, are not scored.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.accuracy.corpus import EmulatedJob, Run, SaveProfile
from bench.accuracy.labels import applicable

MAX_RULES_PER_JOB = 20
Z = 1.959963984540054


@dataclass(frozen=True)
class RuleConf:
    """A labelled rule configuration (SageMaker's DebugRuleConfigurations entry)."""

    label: str
    rule: str
    params: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def of(rule: str, label: str | None = None, **params: Any) -> RuleConf:
        items = tuple(sorted((k, str(v)) for k, v in params.items()))
        if label is None:
            label = rule if not items else f"{rule}[{','.join(f'{k}={v}' for k, v in items)}]"
        return RuleConf(label, rule, items)

    def entry(self, name: str | None = None) -> dict[str, Any]:
        return {
            "RuleConfigurationName": name or self.label,
            "RuleParameters": {"rule_to_invoke": self.rule, **dict(self.params)},
        }

    @property
    def key(self) -> str:
        return json.dumps([self.rule, list(self.params)])


def fingerprint() -> str:
    """Hash of everything a verdict depends on besides the run and the configuration."""
    import trainguard

    from bench.accuracy import corpus

    pkg = Path(trainguard.__file__).parent
    files = sorted(
        [
            *pkg.joinpath("rules").rglob("*.py"),
            *pkg.joinpath("engine").glob("*.py"),
            *pkg.joinpath("format").glob("*.py"),
            pkg / "hook" / "config.py",
            Path(corpus.__file__),
        ]
    )
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def verdicts(
    run: Run, profile: SaveProfile, confs: list[RuleConf], cache: Path, fp: str
) -> dict[str, dict[str, Any]]:
    """conf.key -> {status, step, train_step, details} for every configuration in ``confs``."""
    from trainguard.engine.replay import replay

    path = cache / "scores" / fp / profile.name / f"{run.run_id}.json"
    have: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.is_file() else {}
    todo = [c for c in confs if c.key not in have]
    if todo:
        source = EmulatedJob(run, profile)
        to_train = run.train_step_of()
        for start in range(0, len(todo), MAX_RULES_PER_JOB):
            chunk = todo[start : start + MAX_RULES_PER_JOB]
            names = {f"c{i}": c for i, c in enumerate(chunk)}
            result = replay(source, rules=[c.entry(n) for n, c in names.items()], now=0.0)
            for row in result.summary():
                conf = names.get(row["RuleConfigurationName"])
                if conf is None:
                    continue
                step = row["Step"]
                have[conf.key] = {
                    "status": row["RuleEvaluationStatus"],
                    "step": step,
                    "train_step": to_train(step) if step is not None else None,
                    "details": (row["StatusDetails"] or "")[:400],
                    "saved_steps": source.saved_steps,
                }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(have))
        tmp.replace(path)
    return {c.key: have[c.key] for c in confs}


# ------------------------------------------------------------------------------ judging
@dataclass
class Judgement:
    kind: str  # TP | FN | FP | TN | ignored
    run_id: str
    reason: str = ""
    delay: int | None = None
    alert: int | None = None
    #: FP only: clean | near-miss | other-fault | premature
    where: str = ""
    details: str = ""


def judge(conf: RuleConf, verdict: dict[str, Any], lab: dict[str, Any], run_id: str) -> list[Judgement]:
    if not applicable(conf.rule, lab["family"]):
        return [Judgement("ignored", run_id, "not applicable")]
    kind = lab.get("kind")
    if kind == "suboptimal" or (kind == "fault" and lab.get("harm") not in ("harmful", "unharmed")):
        return [Judgement("ignored", run_id, f"label {kind}/{lab.get('harm')}")]
    fired = verdict["status"] == "IssuesFound"
    t = verdict.get("train_step")
    details = verdict.get("details", "")
    inject = lab.get("inject_step")
    if kind == "fault" and lab["harm"] == "harmful":
        if conf.rule in lab.get("positive_for", []):
            if fired and t is not None and t >= inject:
                return [
                    Judgement("TP", run_id, delay=max(0, t - lab["onset_step"]), alert=t, details=details)
                ]
            if fired:
                return [
                    Judgement("FN", run_id, "premature", alert=t, details=details),
                    Judgement(
                        "FP", run_id, "before the switch-on", alert=t, where="premature", details=details
                    ),
                ]
            return [Judgement("FN", run_id, verdict["status"], details=details)]
        tolerated = lab.get("tolerated", [])
        if tolerated == "*" or conf.rule in tolerated:
            if fired and t is not None and t < inject:
                return [
                    Judgement(
                        "FP", run_id, "before the switch-on", alert=t, where="premature", details=details
                    )
                ]
            return [Judgement("ignored", run_id, "tolerated")]
        where = "other-fault"
    elif kind == "fault":
        where = "near-miss"
    else:
        where = "clean"
    if fired:
        return [Judgement("FP", run_id, alert=t, where=where, details=details)]
    if verdict["status"] == "Error":
        return [Judgement("TN", run_id, "Error", details=details)]
    return [Judgement("TN", run_id)]


# ------------------------------------------------------------------------------ metrics
def wilson(k: int, n: int) -> tuple[float, float] | None:
    if n == 0:
        return None
    p = k / n
    denom = 1 + Z * Z / n
    centre = (p + Z * Z / (2 * n)) / denom
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class Metrics:
    label: str
    rule: str
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0
    clean_runs: int = 0
    clean_alarms: int = 0
    fp_where: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    delays: list[int] = field(default_factory=list)
    misses: list[Judgement] = field(default_factory=list)
    false_alarms: list[Judgement] = field(default_factory=list)
    errors: int = 0

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None

    @property
    def fa_per_100(self) -> float | None:
        return 100.0 * self.clean_alarms / self.clean_runs if self.clean_runs else None

    @property
    def median_delay(self) -> float | None:
        return statistics.median(self.delays) if self.delays else None

    def meets(self, delay_budget: int) -> dict[str, bool | None]:
        p, r, fa, d = self.precision, self.recall, self.fa_per_100, self.median_delay
        return {
            "precision": None if p is None else p >= 0.95,
            "recall": None if r is None else r >= 0.90,
            "false_alarms": None if fa is None else fa <= 1.0,
            "delay": None if d is None else d <= delay_budget,
        }

    def all_met(self, delay_budget: int) -> bool:
        return all(v is True for v in self.meets(delay_budget).values())


def score(conf: RuleConf, items: Iterable[tuple[str, dict[str, Any], dict[str, Any]]]) -> Metrics:
    """``items``: (run_id, verdict, labels) of the runs to score on."""
    m = Metrics(conf.label, conf.rule)
    for run_id, verdict, lab in items:
        for j in judge(conf, verdict, lab, run_id):
            if j.kind == "ignored":
                continue
            if lab.get("kind") == "clean" and j.kind in ("FP", "TN"):
                m.clean_runs += 1
                m.clean_alarms += j.kind == "FP"
            if j.kind == "TP":
                m.tp += 1
                assert j.delay is not None
                m.delays.append(j.delay)
            elif j.kind == "FP":
                m.fp += 1
                m.fp_where[j.where] += 1
                m.false_alarms.append(j)
            elif j.kind == "FN":
                m.fn += 1
                m.misses.append(j)
                m.errors += j.reason == "Error"
            else:
                m.tn += 1
                m.errors += j.reason == "Error"
    return m
