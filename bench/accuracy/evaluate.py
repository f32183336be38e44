"""Score the stored corpus: label it, replay every run under each save profile, compute metrics."""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.accuracy import labels as labelling
from bench.accuracy.corpus import (
    Run,
    SaveProfile,
    load_runs,
    sagemaker_default,
    trainguard_default,
    trainguard_eval_every_step,
)
from bench.accuracy.score import Metrics, RuleConf, fingerprint, score, verdicts
from bench.accuracy.tune import candidate_confs, choose, sagemaker_conf


def profiles() -> list[SaveProfile]:
    """trainguard's defaults, SageMaker's, and trainguard's with every EVAL step saved."""
    return [trainguard_default(), sagemaker_default(), trainguard_eval_every_step()]


def delay_budget(profile: SaveProfile) -> int:
    """Two save intervals of the profile's tensor collections (the coarsest default schedule)."""
    from trainguard.hook.config import CollectionKeys
    from trainguard.modes import ModeKeys

    return 2 * profile.config(CollectionKeys.WEIGHTS).get_save_config(ModeKeys.TRAIN).interval


@dataclass
class Evaluation:
    runs: list[Run]
    labels: dict[str, dict[str, Any]]
    confs: dict[str, list[RuleConf]]
    #: profile -> run_id -> conf key -> verdict
    verdicts: dict[str, dict[str, dict[str, dict[str, Any]]]]
    fingerprint: str
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: rule -> SageMaker's documented defaults given explicitly (None: none differ or none
    #: can be run), and a note on the parameters left out
    sagemaker: dict[str, tuple[RuleConf | None, str]] = field(default_factory=dict)
    #: False after ``evaluate(dev_only=True)``: the test split was not scored
    test_scored: bool = True

    def sagemaker_of(self, rule: str) -> RuleConf | None:
        return self.sagemaker.get(rule, (None, ""))[0]

    def items(
        self, profile: str, split: str, conf: RuleConf
    ) -> Iterable[tuple[str, dict[str, Any], dict[str, Any]]]:
        for run in self.runs:
            lab = self.labels[run.run_id]
            if lab["split"] != split:
                continue
            v = self.verdicts[profile].get(run.run_id, {}).get(conf.key)
            if v is not None:
                yield run.run_id, v, lab

    def metrics(self, profile: str, split: str, conf: RuleConf) -> Metrics:
        return score(conf, self.items(profile, split, conf))

    def chosen(self, rule: str) -> Metrics:
        budget = delay_budget(trainguard_default())
        return choose([self.metrics("trainguard", "dev", c) for c in self.confs[rule]], budget)

    def conf_by_label(self, label: str) -> RuleConf:
        for confs in self.confs.values():
            for c in confs:
                if c.label == label:
                    return c
        raise KeyError(label)


def _confs_for(run: Run, confs: dict[str, list[RuleConf]]) -> list[RuleConf]:
    family = run.spec.family
    return [c for rule, cs in confs.items() if labelling.applicable(rule, family) for c in cs]


def _score_run(
    item: tuple[str, str, list[dict[str, Any]], str],
) -> tuple[str, str, dict[str, dict[str, Any]]]:
    root, profile_name, raw_confs, fp = item
    import json

    run = Run(Path(root), json.loads((Path(root) / "run.json").read_text()))
    profile = {p.name: p for p in profiles()}[profile_name]
    confs = [RuleConf(c["label"], c["rule"], tuple(tuple(x) for x in c["params"])) for c in raw_confs]
    cache = Path(root).parents[1]
    return run.run_id, profile_name, verdicts(run, profile, confs, cache, fp)


def _replay_all(
    items: list[tuple[str, str, list[dict[str, Any]], str]],
    workers: int,
    out: dict[str, dict[str, dict[str, dict[str, Any]]]],
) -> None:
    def take(result: tuple[str, str, dict[str, dict[str, Any]]]) -> None:
        run_id, profile_name, v = result
        out[profile_name].setdefault(run_id, {}).update(v)

    if workers > 1:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(workers) as pool:
            for i, result in enumerate(pool.imap_unordered(_score_run, items, chunksize=2), 1):
                take(result)
                if i % 50 == 0:
                    print(f"scored {i}/{len(items)}", file=sys.stderr, flush=True)
    else:
        for i, item in enumerate(items, 1):
            take(_score_run(item))
            if i % 50 == 0:
                print(f"scored {i}/{len(items)}", file=sys.stderr, flush=True)


def _raw(confs: Iterable[RuleConf]) -> list[dict[str, Any]]:
    return [{"label": c.label, "rule": c.rule, "params": [list(p) for p in c.params]} for c in confs]


def evaluate(
    cache: Path,
    workers: int = 1,
    only_defaults: bool = False,
    dev_only: bool = False,
    eval_every_step: bool = True,
) -> Evaluation:
    """Pass 1: the dev split with every candidate (trainguard profile). Choose. Pass 2 (unless
    ``dev_only``): the test split with each rule's default, SageMaker's defaults and the
    choice, and both splits under the other save profiles with the same configurations."""
    started = time.perf_counter()
    labels = labelling.label_corpus(cache)
    runs = load_runs(cache)
    skipped: list[str] = []
    confs = candidate_confs(skipped)
    sagemaker = {rule: sagemaker_conf(rule) for rule in confs}
    if only_defaults:
        confs = {
            rule: [c for i, c in enumerate(cs) if i == 0 or c == sagemaker[rule][0]]
            for rule, cs in confs.items()
        }
    fp = fingerprint()
    scored = [
        r
        for r in runs
        if labels[r.run_id].get("kind") != "suboptimal"
        and labels[r.run_id].get("harm") not in ("grey", "no-twin")
    ]
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {p.name: {} for p in profiles()}
    dev = [r for r in scored if r.spec.split == "dev"]
    _replay_all([(str(r.root), "trainguard", _raw(_confs_for(r, confs)), fp) for r in dev], workers, out)
    ev = Evaluation(runs, labels, confs, out, fp, skipped, sagemaker=sagemaker)
    if dev_only:
        ev.test_scored = False
        ev.seconds = time.perf_counter() - started
        return ev
    chosen = {rule: ev.conf_by_label(ev.chosen(rule).label) for rule in confs}
    final: dict[str, list[RuleConf]] = {}
    for rule, cs in confs.items():
        keep = [cs[0]]
        for extra in (ev.sagemaker_of(rule), chosen[rule]):
            if extra is not None and extra.key not in {c.key for c in keep}:
                keep.append(extra)
        final[rule] = keep
    items = []
    for r in scored:
        mine = _raw(_confs_for(r, final))
        if r.spec.split != "dev":
            items.append((str(r.root), "trainguard", mine, fp))
        items.append((str(r.root), "sagemaker", mine, fp))
        if eval_every_step:
            items.append((str(r.root), "trainguard-eval1", mine, fp))
    _replay_all(items, workers, out)
    ev.seconds = time.perf_counter() - started
    return ev
