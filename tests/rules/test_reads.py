"""Every rule's ``reads()`` covers every statistic, tensor and scalar the rule actually reads.

The hook computes only what the configured rules declare (issue 10). So each rule is run on a
job that saves everything, then on the same job reduced to what its ``reads()`` selects: the
tensors and scalars some input selects, each tensor with only the statistics the inputs that
select it list (the others absent, as a hook that did not compute them writes them). The
verdicts, findings and coverage must be the same, and the rule must have checked something.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from fulljobs import job, with_headers
from rulejobs import make, run
from trainguard.format.documents import StepHeader
from trainguard.rules.base import STATISTICS, Rule, RuleInput, StepData
from trainguard.rules.registry import RULES

#: per rule: (parameters, faults) scenarios; at least one fires and at least one passes
SCENARIOS: dict[str, list[tuple[dict[str, str], tuple[str, ...]]]] = {
    "VanishingGradient": [({}, ()), ({}, ("vanishing",))],
    "ExplodingTensor": [
        ({}, ()),
        ({}, ("nan_loss",)),
        ({"collection_names": "gradients"}, ()),
        ({"tensor_regex": "gradient/.*", "only_nan": "True"}, ()),
        ({"collection_names": "losses"}, ("nan_loss",)),
    ],
    "LossNotDecreasing": [
        ({}, ()),
        ({"diff_percent": "0"}, ("flat_loss",)),
        ({"mode": "TRAIN", "num_steps": "5"}, ()),
        ({"mode": "TRAIN", "num_steps": "5"}, ("flat_loss",)),
        ({"mode": "TRAIN", "diff_percent": "0"}, ("flat_loss",)),
        ({"use_losses_collection": "False", "tensor_regex": "loss", "diff_percent": "0"}, ("flat_loss",)),
    ],
    "Overfit": [({}, ()), ({"ratio_threshold": "0.1"}, ("overfit",))],
    "Overtraining": [({"patience_train": "1000"}, ()), ({}, ("flat_loss",))],
    "DeadRelu": [({}, ()), ({}, ("dead_relu",))],
    "SaturatedActivation": [({}, ()), ({}, ("saturated",))],
    "PoorWeightInitialization": [({}, ()), ({}, ("poor_init",))],
    "WeightUpdateRatio": [({}, ()), ({}, ("huge_update",))],
    "AllZero": [({}, ()), ({}, ("zero_weights",)), ({"tensor_regex": "fc1\\..*"}, ("zero_weights",))],
    "UnchangedTensor": [({}, ()), ({}, ("frozen",)), ({"collection_names": "weights"}, ("frozen",))],
    "TensorVariance": [({}, ()), ({}, ("huge_variance",)), ({"max_threshold": "100"}, ("huge_variance",))],
    "ClassImbalance": [({}, ()), ({}, ("imbalanced",)), ({}, ("confused",))],
    "Confusion": [
        ({"start_step": "0"}, ()),
        ({"start_step": "0", "min_diag": "0.9"}, ("confused",)),
        ({"mode": "None", "start_step": "0", "max_off_diag": "0.1"}, ("confused",)),
    ],
    "CheckInputImages": [({"threshold_samples": "20"}, ()), ({"threshold_samples": "20"}, ("raw_images",))],
    "NLPSequenceRatio": [({}, ()), ({}, ("padding",))],
    "FeatureImportanceOverweight": [({}, ()), ({}, ("overweight",))],
    "TreeDepth": [({}, ()), ({}, ("deep_trees",))],
    "CreateXgboostReport": [({}, ())],
    "StalledTrainingRule": [({}, ())],
    "OscillatingLoss": [({"min_evaluations": "4"}, ()), ({"smoothing_steps": "1"}, ("oscillating",))],
    "DataNotNormalized": [({}, ()), ({}, ("raw_images",))],
    "GradientNormRatio": [({}, ()), ({}, ("exploding_ratio",))],
    "LossConverged": [({"num_steps": "5", "mode": "TRAIN"}, ()), ({"num_steps": "5"}, ("converged",))],
    "LossDivergence": [({}, ()), ({}, ("diverging",)), ({"mode": "TRAIN"}, ("nan_loss",))],
    "SimilarAcrossRuns": [({"other_trials": "other-job"}, ())],
}
#: rules that never fire from ``update`` (a report, a clock rule, a cross-job rule)
NEVER_FIRE_ON_UPDATE = {"CreateXgboostReport", "StalledTrainingRule", "SimilarAcrossRuns"}


def reduce_to_reads(inputs: tuple[RuleInput, ...], steps: list[StepData]) -> list[StepData]:
    """The steps as a hook that saves exactly ``inputs`` would write them."""

    def edit(h: StepHeader) -> StepHeader:
        modes = {}
        for mode, rec in h.modes.items():
            scalars = {
                n: sc
                for n, sc in rec.scalars.items()
                if any(i.selects(n, sc.collections, mode, scalar=True) for i in inputs)
            }
            tensors = {}
            for n, t in rec.tensors.items():
                chosen = [i for i in inputs if i.selects(n, t.collections, mode, scalar=False)]
                if not chosen:
                    continue
                keep = {s for i in chosen for s in i.statistics}
                stats = (
                    t.stats.model_copy(update={f: None for f in STATISTICS if f not in keep})
                    if t.stats is not None
                    else None
                )
                tensors[n] = t.model_copy(update={"stats": stats})
            modes[mode] = rec.model_copy(update={"scalars": scalars, "tensors": tensors})
        return h.model_copy(update={"modes": modes})

    return with_headers(steps, edit)


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


def _run(rule: Rule[Any, Any], steps: list[StepData]) -> tuple[int | None, Any, int]:
    out = run(rule, steps)
    coverage = rule.coverage(out.state)
    assert coverage is not None, f"{rule.name} reports no coverage"
    finding = out.findings[0] if out.findings else None
    return out.fired_at, finding, coverage.checked


def test_every_rule_has_scenarios() -> None:
    assert set(SCENARIOS) == set(RULES)


@pytest.mark.parametrize("name", sorted(set(RULES) - {"SimilarAcrossRuns"}))
def test_reads_cover_what_the_rule_reads(name: str) -> None:
    fired = passed = 0
    for params, faults in SCENARIOS[name]:
        rule = make(name, **params)
        full = job(faults)
        reduced = reduce_to_reads(rule.reads(), full)
        at, finding, checked = _run(rule, full)
        at2, finding2, checked2 = _run(rule, reduced)
        where = f"{name} {params} {faults}"
        assert checked > 0, f"{where}: checked nothing on a job that saves everything"
        assert (at, checked) == (at2, checked2), (
            f"{where}: {at, checked} with everything, {at2, checked2} reduced"
        )
        if finding is not None:
            assert finding2 is not None and finding.tensor == finding2.tensor, where
            assert _same(finding.value, finding2.value) and finding.message == finding2.message, where
            fired += 1
        else:
            passed += 1
    assert passed, f"{name}: no scenario passes"
    assert fired or name in NEVER_FIRE_ON_UPDATE, f"{name}: no scenario fires"


def test_similar_across_runs_reads_cover_compare() -> None:
    rule = make("SimilarAcrossRuns", other_trials="other-job")
    for ours, theirs, fires in ((job(()), job(()), False), (job(()), job(("huge_variance",)), True)):
        outcomes = []
        for a, b in (
            (ours, theirs),
            (reduce_to_reads(rule.reads(), ours), reduce_to_reads(rule.reads(), theirs)),
        ):
            state = rule.initial_state()
            at = None
            for sa, sb in zip(a, b, strict=True):
                state, found = rule.update(state, sa)
                state, found = rule.compare(state, sa, sb)
                if found:
                    at = found[0].step
                    break
            coverage = rule.coverage(state)
            outcomes.append((at, coverage.checked))
        assert outcomes[0] == outcomes[1] and outcomes[0][1] > 0
        assert (outcomes[0][0] is not None) == fires


def test_inputs_name_what_they_are_and_known_statistics() -> None:
    for name, cls in RULES.items():
        for params, _ in SCENARIOS[name]:
            for item in make(name, **params).reads():
                assert item.what and set(item.statistics) <= set(STATISTICS)
                assert item.scalars or item.statistics or name == "StalledTrainingRule", (name, item)
