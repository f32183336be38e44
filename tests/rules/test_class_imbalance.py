"""Golden tests for ClassImbalance."""

from __future__ import annotations

import numpy as np
from rulejobs import LONG, config_error, long_run, make, repeat, run, state_bytes, step_data, tensor
from trainguard.rules.class_imbalance import MAX_CLASSES


def batch(step: int, labels: list[int], preds: list[int] | np.ndarray | None = None) -> object:
    t = {"labels": tensor(labels, ["labels"], dtype="int64", values=[float(x) for x in labels])}
    if preds is not None:
        p = np.asarray(preds, dtype=float)
        t["predictions"] = tensor(p, ["predictions"], values=p.ravel().tolist())
    return step_data(step, tensors=t)


def test_imbalance_fires_once_enough_samples() -> None:
    # each batch: 95 of class 0, 5 of class 1 (ratio 19 > 10); 500 samples reached at the 5th batch
    labels = [0] * 95 + [1] * 5
    out = run(make("ClassImbalance"), [batch(s, labels, labels) for s in range(8)])
    assert out.fired_at == 4
    assert out.finding.value == 19.0 and out.finding.threshold == 10.0
    assert "the last 500 TRAIN labels" in out.finding.message


def test_balanced_and_well_predicted_does_not_fire() -> None:
    labels = [0, 1, 2, 3] * 25
    assert run(make("ClassImbalance"), [batch(s, labels, labels) for s in range(10)]).fired_at is None


def test_misprediction_rate_fires() -> None:
    labels = [0, 1] * 50
    preds = [0] * 100  # class 1 always mispredicted
    out = run(make("ClassImbalance", samples="200"), [batch(s, labels, preds) for s in range(4)])
    assert out.fired_at == 1 and out.finding.value == 1.0 and "class 1" in out.finding.message


def test_argmax_predictions() -> None:
    labels = [0, 1] * 50
    scores = np.array([[0.9, 0.1]] * 100)  # argmax 0 everywhere
    rule = make("ClassImbalance", samples="100", argmax="True")
    assert run(rule, [batch(0, labels, scores)]).fired_at == 0
    rule = make("ClassImbalance", samples="100", argmax="True", threshold_misprediction="1.0")
    assert run(rule, [batch(0, labels, scores)]).fired_at is None


def test_without_values_nothing_is_counted() -> None:
    s = step_data(0, tensors={"labels": tensor([0, 0, 1], ["labels"])})
    out = run(make("ClassImbalance", samples="1"), [s])
    assert out.fired_at is None and out.state.total == 0


def test_parameters() -> None:
    c = make(
        "ClassImbalance",
        threshold_imbalance="5",
        threshold_misprediction="0.5",
        samples="100",
        argmax="True",
        labels_regex="y_true",
        predictions_regex="y_pred",
    ).config
    assert (c.threshold_imbalance, c.threshold_misprediction, c.samples, c.argmax) == (5.0, 0.5, 100, True)
    assert (c.labels_regex, c.predictions_regex) == ("y_true", "y_pred")
    assert "samples" in config_error("ClassImbalance", samples="0")
    assert "labels_regex" in config_error("ClassImbalance", labels_regex="[")


def test_state_bounded() -> None:
    rule = make("ClassImbalance", threshold_imbalance="1e9", threshold_misprediction="2")
    many = list(range(1000))
    state, fired = long_run(rule, [batch(0, many, many)])
    assert len({k for c in state.chunks for k in c.counts}) == MAX_CLASSES
    assert state.other == 1000 - MAX_CLASSES and state_bytes(rule, state) < 8192
    labels = [0, 1, 2, 3]
    state, fired = long_run(rule, repeat(batch(0, labels, labels), LONG))
    assert fired is None and state.total == 4 * LONG and state_bytes(rule, state) < 1500
    assert 500 <= sum(c.n for c in state.chunks) <= 500 + 500 // 8


def test_window_of_the_last_samples_labels() -> None:
    # early imbalance (an unshuffled start) that the data later outgrows: judged on the last 500
    early = [batch(s, [0] * 100) for s in range(3)]
    later = [batch(s, [0, 1] * 50, [0, 1] * 50) for s in range(3, 20)]
    out = run(make("ClassImbalance"), early + later)
    assert out.fired_at is None and out.state.judgements > 0
    # an untrained model's mispredictions fall out of the window as it learns
    learning = [batch(s, [0, 1] * 50, [0] * 100 if s < 2 else [0, 1] * 50) for s in range(20)]
    assert run(make("ClassImbalance"), learning).fired_at is None


def test_eval_labels_are_judged_once_saved() -> None:
    def both(step: int, train: list[int], evaluation: list[int]):
        from rulejobs import M, header
        from trainguard.rules.base import StepData

        def t(v: list[int]) -> dict:
            return {"loss/labels": tensor(v, ["labels"], dtype="int64", values=[float(x) for x in v])}

        return StepData.from_headers(
            [header(step, {"TRAIN": M(step, tensors=t(train)), "EVAL": M(step, tensors=t(evaluation))})]
        )

    # training data imbalanced by design (a sampler), validation balanced: EVAL is judged
    steps = [both(s, [0] * 99 + [1], [0, 1] * 50) for s in range(10)]
    out = run(make("ClassImbalance"), steps)
    assert out.fired_at is None and out.state.mode == "EVAL"
    assert run(make("ClassImbalance", mode="TRAIN"), steps).fired_at == 4


def test_scores_are_reduced_by_argmax_unless_sagemaker_false_is_given() -> None:
    labels = [0, 1] * 50
    scores = np.array([[0.2, 0.8], [0.9, 0.1]] * 50)  # argmax: 1, 0, 1, 0... all wrong
    assert run(make("ClassImbalance", samples="100"), [batch(0, labels, scores)]).fired_at == 0
    # explicit False: 200 values are not 100 class ids: no mispredictions counted
    assert (
        run(make("ClassImbalance", samples="100", argmax="False"), [batch(0, labels, scores)]).fired_at
        is None
    )
