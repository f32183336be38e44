"""Smoke test of the accuracy benchmark (bench/accuracy): the whole path on a tiny corpus.

Trains a clean tabular run and three faulty twins for 60 steps through the real hook,
stores them, labels them, and scores two rules by replaying the stored runs under both
emulated save profiles. The full corpus is ``make bench-accuracy``; this only proves the
machinery (seconds), plus the pure pieces (judging, Wilson intervals, merged statistics,
onset dating) on hand-made inputs.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.accuracy import labels as labelling
from bench.accuracy import plan
from bench.accuracy.corpus import EmulatedJob, load_runs, merge_stats, sagemaker_default, trainguard_default
from bench.accuracy.plan import RunSpec, TrainConfig
from bench.accuracy.score import RuleConf, judge, score, verdicts, wilson

pytestmark = pytest.mark.torch

STEPS = 60


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dataclasses import asdict

    from bench.accuracy.record import record

    cache = tmp_path_factory.mktemp("corpus")
    mp = pytest.MonkeyPatch()
    mp.setattr(plan, "STEPS", STEPS)
    mp.setattr(plan, "EVAL_EVERY", 20)
    try:
        cfg = asdict(TrainConfig("adam", 3e-3, "constant", 0.0, "relu", 64))
        twin = RunSpec(plan.clean_id("tabular", "smoke", 0), "dev", "tabular", 0, cfg)
        faults = [
            RunSpec("stall-smoke", "dev", "tabular", 0, cfg, "stall", 2, {"factor": 0.0}, 12, twin.run_id),
            RunSpec(
                "nan-smoke",
                "dev",
                "tabular",
                0,
                cfg,
                "corrupt_batch",
                1,
                {"kind": "nan", "every": 0},
                25,
                twin.run_id,
            ),
            RunSpec("dead-smoke", "dev", "tabular", 0, cfg, "dead_relu", 2, {"share": 1.0}, 12, twin.run_id),
        ]
        for spec in (twin, *faults):
            record(spec, cache)
    finally:
        mp.undo()
    return cache


def test_runs_are_stored_with_the_hooks_steps_and_a_twin_equal_up_to_the_onset(corpus: Path) -> None:
    runs = {r.run_id: r for r in load_runs(corpus)}
    assert set(runs) == {plan.clean_id("tabular", "smoke", 0), "stall-smoke", "nan-smoke", "dead-smoke"}
    twin = runs[plan.clean_id("tabular", "smoke", 0)]
    stall = runs["stall-smoke"]
    assert stall.meta["recorded"]["format"] in (1, 2)
    train = [s for s in twin.steps() if "TRAIN" in s["modes"]]
    assert len(train) == STEPS
    # tensors every TRAIN_RECORD_INTERVAL TRAIN steps, losses every step
    with_tensors = [s["modes"]["TRAIN"]["mode_step"] for s in train if s["modes"]["TRAIN"]["tensors"]]
    assert with_tensors == list(range(0, STEPS, plan.TRAIN_RECORD_INTERVAL))
    assert all(s["modes"]["TRAIN"]["scalars"] for s in train)
    # deterministic: the faulty run equals its twin until the switch-on
    a, b = twin.trace()["signals"]["loss"], stall.trace()["signals"]["loss"]
    assert a[:12] == b[:12]
    assert a[12:] != b[12:]
    assert runs["nan-smoke"].outcome["diverged"] is True
    with gzip.open(twin.root / "updates.json.gz", "rt") as fh:
        assert "50" in json.load(fh)


def test_emulated_profiles_keep_only_what_that_save_config_saves(corpus: Path) -> None:
    run = next(r for r in load_runs(corpus) if r.spec.fault is None)
    tg = EmulatedJob(run, trainguard_default())
    sm = EmulatedJob(run, sagemaker_default())
    tensor_steps = []
    for ref in tg.objects():
        if ref.step is None:
            continue
        raw, _ = tg.head(ref)
        from trainguard.format.documents import decode_step_header

        header, _ = decode_step_header(raw)
        for mode, rec in header.modes.items():
            if rec.tensors:
                tensor_steps.append((mode, rec.mode_step))
    assert ("TRAIN", 0) in tensor_steps and ("TRAIN", 50) in tensor_steps
    assert all(step % 50 == 0 for _, step in tensor_steps)
    assert tg.saved_steps == len(run.steps())  # a loss every step: every step is kept
    assert sm.saved_steps == 2  # TRAIN step 0 and EVAL step 0 (no step 500 in 60 steps)


def test_labels_and_scores_from_cause_and_outcome(corpus: Path) -> None:
    labs = labelling.label_corpus(corpus)
    twin = labs[plan.clean_id("tabular", "smoke", 0)]
    assert twin["kind"] == "clean"  # the only configuration is its family's best
    stall = labs["stall-smoke"]
    assert stall["inject_step"] == 12 and stall["onset_method"] == "effect" and stall["onset_step"] >= 12
    nan = labs["nan-smoke"]
    assert nan["harm"] == "harmful" and nan["diverged"] and "ExplodingTensor" in nan["positive_for"]
    assert nan["onset_step"] == 25
    runs = {r.run_id: r for r in load_runs(corpus)}
    confs = [RuleConf.of("ExplodingTensor"), RuleConf.of("DeadRelu")]
    for profile in (trainguard_default(), sagemaker_default()):
        got = {rid: verdicts(r, profile, confs, corpus, "smoke") for rid, r in runs.items()}
        again = {rid: verdicts(r, profile, confs, corpus, "smoke") for rid, r in runs.items()}
        assert got == again  # cached
        assert (corpus / "scores" / "smoke" / profile.name).is_dir()
        exploding = score(confs[0], ((rid, v[confs[0].key], labs[rid]) for rid, v in got.items()))
        if profile.name == "trainguard":
            # the NaN loss is saved every step: caught at once, no false alarm on the twin
            assert exploding.tp == 1 and exploding.fp == 0 and exploding.median_delay == 0
        else:
            assert exploding.tp == 0 and exploding.fn == 1  # 2 saved steps: nothing to see
            assert exploding.misses[0].run_id == "nan-smoke"


def test_judging_rules() -> None:
    lab_pos = {
        "family": "tabular",
        "kind": "fault",
        "harm": "harmful",
        "positive_for": ["DeadRelu"],
        "tolerated": [],
        "inject_step": 100,
        "onset_step": 110,
    }
    conf = RuleConf.of("DeadRelu")
    fired = {"status": "IssuesFound", "train_step": 150, "details": "x"}
    early = {"status": "IssuesFound", "train_step": 50, "details": "x"}
    quiet = {"status": "NoIssuesFound", "train_step": None, "details": ""}
    assert [j.kind for j in judge(conf, fired, lab_pos, "r")] == ["TP"]
    assert judge(conf, fired, lab_pos, "r")[0].delay == 40
    assert [j.kind for j in judge(conf, early, lab_pos, "r")] == ["FN", "FP"]
    assert [j.kind for j in judge(conf, quiet, lab_pos, "r")] == ["FN"]
    clean = {"family": "tabular", "kind": "clean"}
    assert [(j.kind, j.where) for j in judge(conf, fired, clean, "c")] == [("FP", "clean")]
    near = {"family": "tabular", "kind": "fault", "harm": "unharmed", "inject_step": 100}
    assert [(j.kind, j.where) for j in judge(conf, fired, near, "n")] == [("FP", "near-miss")]
    tolerated = {**lab_pos, "positive_for": ["AllZero"], "tolerated": ["DeadRelu"]}
    assert [j.kind for j in judge(conf, fired, tolerated, "t")] == ["ignored"]
    assert [j.kind for j in judge(conf, early, tolerated, "t")] == ["FP"]
    other = {**lab_pos, "positive_for": ["AllZero"], "tolerated": []}
    assert [(j.kind, j.where) for j in judge(conf, fired, other, "o")] == [("FP", "other-fault")]
    assert judge(RuleConf.of("TreeDepth"), fired, clean, "c")[0].kind == "ignored"  # not applicable
    assert judge(conf, fired, {"family": "tabular", "kind": "suboptimal"}, "s")[0].kind == "ignored"


def test_wilson_interval() -> None:
    lo, hi = wilson(9, 10) or (0, 0)
    assert math.isclose(lo, 0.5958, abs_tol=1e-3) and math.isclose(hi, 0.9821, abs_tol=1e-3)
    assert wilson(0, 0) is None
    lo, hi = wilson(0, 100) or (1, 1)
    assert lo < 1e-12 and hi < 0.04


def test_merged_statistics_equal_those_of_the_concatenation() -> None:
    import numpy as np

    parts = [np.array([1.0, 2.0, 0.0]), np.array([5.0, -1.0])]

    def stats(x: np.ndarray) -> dict[str, float]:
        return {
            "numel": x.size,
            "mean": x.mean(),
            "std": x.std(),
            "min": x.min(),
            "max": x.max(),
            "mean_abs": np.abs(x).mean(),
            "l1": np.abs(x).sum(),
            "l2": np.sqrt((x**2).sum()),
            "zeros": int((x == 0).sum()),
            "nan": 0,
            "inf": 0,
        }

    merged = merge_stats([stats(p) for p in parts])
    whole = stats(np.concatenate(parts))
    for key, value in whole.items():
        assert math.isclose(merged[key], value, rel_tol=1e-9, abs_tol=1e-12), key


def test_the_whole_benchmark_scores_the_tiny_corpus_and_renders_the_doc(corpus: Path) -> None:
    """``evaluate`` + ``render``, the code behind ``make bench-accuracy``, end to end."""
    from bench.accuracy.evaluate import evaluate
    from bench.accuracy.report import render, render_dev_choices
    from bench.accuracy.tune import SCORED_RULES

    ev = evaluate(corpus, only_defaults=True)
    exploding = ev.metrics("trainguard", "dev", ev.confs["ExplodingTensor"][0])
    assert exploding.tp == 1 and exploding.fp == 0
    # SageMaker's documented defaults are scored beside trainguard's, on every profile
    overtraining = ev.sagemaker_of("Overtraining")
    assert overtraining is not None
    assert dict(overtraining.params) == {"patience_train": "5", "delta": "0.1"}
    assert overtraining.key in ev.verdicts["sagemaker"][plan.clean_id("tabular", "smoke", 0)]
    doc = render(ev, {"cache": str(corpus)})
    assert doc.startswith("# Rule accuracy: benchmark v2")
    headline = doc.split("Headline, test split", 1)[1].split("## The corpus", 1)[0]
    for rule in SCORED_RULES:
        assert f"| {rule} |" in headline
    assert "| Overtraining |" in headline and "not a SageMaker rule" in headline
    assert "Defaults the dev split supports" in doc and "SageMaker's default" in doc
    choices = render_dev_choices(ev)
    assert "| ExplodingTensor |" in choices and "keep the default" in choices


def test_a_default_changes_only_on_evidence_from_the_dev_split() -> None:
    from bench.accuracy.score import Metrics
    from bench.accuracy.tune import MIN_EVIDENCE_RUNS, choose

    def m(label: str, tp: int, fn: int, fp: int, clean_alarms: int) -> Metrics:
        out = Metrics(label, "R", tp=tp, fn=fn, fp=fp, clean_runs=100, clean_alarms=clean_alarms)
        out.delays = [0] * tp
        return out

    default = m("default", 8, 2, 0, 0)
    assert choose([default, m("one more", 9, 1, 0, 0)], 100).label == "default"  # 1 run: noise
    better = m("better", 8 + MIN_EVIDENCE_RUNS, 2 - MIN_EVIDENCE_RUNS, 0, 0)
    assert choose([default, better], 100).label == "better"
    noisy = m("noisy", 10, 0, 30, 30)
    assert choose([noisy, m("quiet", 7, 3, 0, 0)], 100).label == "quiet"  # reaches the FA target
    assert choose([m("two", 10, 0, 2, 2), m("one", 10, 0, 1, 1)], 100).label == "two"  # 1 clean alarm


def test_sagemaker_defaults_come_from_the_rule_catalog() -> None:
    from trainguard.rules.catalog import DEPARTURES

    from bench.accuracy.tune import sagemaker_conf

    conf, _ = sagemaker_conf("Confusion")
    assert conf is not None
    assert dict(conf.params) == {k: DEPARTURES["Confusion"][k][0] for k in ("min_diag", "max_off_diag")}
    assert sagemaker_conf("OscillatingLoss") == (None, "not a SageMaker rule")
    conf, note = sagemaker_conf("AllZero")
    assert conf is None and "required" in note  # SageMaker has no runnable default
