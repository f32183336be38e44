"""Golden tests for Confusion: column-normalised matrix, relative test on EVAL passes by default."""

from __future__ import annotations

import numpy as np
from rulejobs import (
    LONG,
    SHORT,
    M,
    config_error,
    header,
    long_run,
    make,
    repeat,
    run,
    state_bytes,
    step_data,
    tensor,
)
from trainguard.rules.base import StepData

SAGEMAKER = {"mode": "None", "start_step": "0"}


def pairs(
    step: int, labels: list[int], preds: list[int], names=("labels", "predictions"), mode="EVAL"
) -> StepData:
    t = {
        names[0]: tensor(labels, [], values=[float(x) for x in labels]),
        names[1]: tensor(preds, [], values=[float(x) for x in preds]),
    }
    return step_data(step, mode=mode, tensors=t)


GOOD = ([0] * 10 + [1] * 10 + [2] * 10, [0] * 10 + [1] * 10 + [2] * 10)
# class 2: 2 of 10 predicted as 0; column 0 holds 12 predictions, 10 right (precision 0.833)
WEAK = (GOOD[0], [0] * 10 + [1] * 10 + [2] * 8 + [0] * 2)


def test_absolute_test_on_column_normalised_matrix() -> None:
    out = run(make("Confusion", min_diag="0.9", **SAGEMAKER), [pairs(0, *GOOD), pairs(1, *WEAK)])
    assert out.fired_at == 1
    assert "confusion[0][0] / column total" in out.finding.message and abs(out.finding.value - 10 / 12) < 1e-9


def test_off_diagonal_over_its_column() -> None:
    rule = make("Confusion", min_diag="0.5", max_off_diag="0.15", **SAGEMAKER)
    out = run(rule, [pairs(0, *WEAK)])
    assert out.fired_at == 0 and "predicted as 0 are class 2" in out.finding.message  # 2/12 = 0.167
    assert (
        run(make("Confusion", min_diag="0.5", max_off_diag="0.25", **SAGEMAKER), [pairs(0, *WEAK)]).fired_at
        is None
    )


def test_only_fully_populated_matrices_are_judged() -> None:
    labels, preds = [0] * 10 + [1] * 10, [1] * 20  # class 0 never predicted; class 2 has no labels
    assert (
        run(
            make("Confusion", category_no="3", min_diag="0.9", **SAGEMAKER), [pairs(0, labels, preds)]
        ).fired_at
        is None
    )
    assert (
        run(
            make("Confusion", category_no="2", min_diag="0.9", **SAGEMAKER), [pairs(0, labels, preds)]
        ).fired_at
        == 0
    )
    assert run(make("Confusion", min_diag="0.9", **SAGEMAKER), [pairs(0, labels, preds)]).fired_at == 0


def evaluation_job(confused_from: int | None, accuracy: float = 0.8, seed: int = 0) -> list[StepData]:
    """300 training steps; every 50 a validation pass of 3 EVAL batches of 30 pairs."""
    rng = np.random.default_rng(seed)
    steps, g = [], 0
    for t in range(300):
        steps.append(StepData.from_headers([header(g, {"TRAIN": M(t, {"loss": 1.0})})]))
        g += 1
        if t % 50 == 49:
            for _ in range(3):
                labels = rng.integers(0, 3, 30)
                right = rng.random(30) < accuracy
                preds = np.where(right, labels, (labels + rng.integers(1, 3, 30)) % 3)
                if confused_from is not None and t >= confused_from:
                    preds = np.where(labels == 2, 0, preds)  # class 2 always predicted as 0
                tens = {
                    "loss/labels": tensor(labels, ["labels"], values=labels.astype(float).tolist()),
                    "loss/predictions": tensor(preds, ["predictions"], values=preds.astype(float).tolist()),
                }
                steps.append(StepData.from_headers([header(g, {"EVAL": M(g, tensors=tens)})]))
                g += 1
    return steps


def test_default_relative_test_on_validation_passes_after_warm_up() -> None:
    # a model still learning (80% right on every class) is not "confused"
    for seed in range(3):
        out = run(make("Confusion"), evaluation_job(None, seed=seed))
        assert out.fired_at is None and out.state.steps_judged == 4, seed  # passes at 149, 199, 249, 299
    # the absolute test fails the same model at its first judged pass
    assert run(make("Confusion", min_diag="0.9"), evaluation_job(None)).fired_at is not None
    # one class folded into another is found
    out = run(make("Confusion"), evaluation_job(150))
    assert out.fired_at is not None and "(relative test)" in out.finding.message


def test_scores_are_reduced_by_argmax() -> None:
    labels = np.array([0, 1, 2] * 10)
    scores = np.eye(3)[labels] * 5.0
    scores[labels == 2] = [5.0, 0.0, 0.0]  # class 2 predicted as 0
    t = {
        "labels": tensor(labels, [], values=labels.astype(float).tolist()),
        "predictions": tensor(scores, [], values=scores.ravel().tolist()),
    }
    out = run(make("Confusion", min_diag="0.9", **SAGEMAKER), [step_data(0, mode="EVAL", tensors=t)])
    assert out.fired_at == 0


def test_names_and_collections() -> None:
    s = pairs(0, *WEAK, names=("y", "yhat"))
    assert run(make("Confusion", min_diag="0.9", **SAGEMAKER), [s]).fired_at is None
    assert (
        run(make("Confusion", labels="y", predictions="yhat", min_diag="0.9", **SAGEMAKER), [s]).fired_at == 0
    )
    t = {"a": tensor([0, 1], ["lab"], values=[0.0, 1.0]), "b": tensor([1, 0], ["pred"], values=[1.0, 0.0])}
    s2 = step_data(0, tensors=t)
    rule = make(
        "Confusion", labels_collection="lab", predictions_collection="pred", min_diag="0.9", **SAGEMAKER
    )
    assert run(rule, [s2]).fired_at == 0


def test_parameters() -> None:
    c = make("Confusion", category_no="10", min_diag="0.8", max_off_diag="0.2").config
    assert (c.category_no, c.min_diag, c.max_off_diag, c.labels, c.predictions) == (
        10,
        0.8,
        0.2,
        "labels",
        "predictions",
    )
    assert c.absolute and not make("Confusion").config.absolute
    d = make("Confusion").config
    assert (d.mode, d.warmup, d.bounds) == ("EVAL", 100, (0.9, 0.1))
    assert "min_diag" in config_error("Confusion", min_diag="1.5")
    assert "category_no" in config_error("Confusion", category_no="0")


def test_state_bounded() -> None:
    rule = make("Confusion", **SAGEMAKER)
    state, fired = long_run(rule, repeat(pairs(0, *GOOD), SHORT))
    assert fired is None and state.steps_judged == SHORT and state_bytes(rule, state) < 300
    # one validation pass with 32 classes, all confused with each other: the largest matrix
    labels = [i % 32 for i in range(1024)]
    preds = [(i // 32) % 32 for i in range(1024)]
    state, _ = long_run(make("Confusion", start_step="0"), [pairs(0, labels, preds)])
    assert len(state.pairs) == 1024 and state_bytes(make("Confusion"), state) < 16_000
    # LONG alternating passes and training steps: the pass is judged and emptied each time
    rule = make("Confusion", start_step="0")
    evaluation, training = pairs(0, *GOOD), step_data(0, train=1.0)
    steps = (StepData(s, (evaluation if s % 2 else training).workers) for s in range(LONG))
    state, fired = long_run(rule, steps)
    assert fired is None and state.steps_judged == LONG // 2 - 1 and len(state.pairs) == 3  # the last pass
