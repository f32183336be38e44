"""Golden tests for Confusion."""

from __future__ import annotations

from rulejobs import SHORT, config_error, long_run, make, repeat, run, state_bytes, step_data, tensor


def pairs(
    step: int, labels: list[int], preds: list[int], names=("labels", "predictions"), mode="EVAL"
) -> object:
    t = {
        names[0]: tensor(labels, [], values=[float(x) for x in labels]),
        names[1]: tensor(preds, [], values=[float(x) for x in preds]),
    }
    return step_data(step, mode=mode, tensors=t)


GOOD = ([0] * 10 + [1] * 10 + [2] * 10, [0] * 10 + [1] * 10 + [2] * 10)
# class 2: 8 of 10 right (diag 0.8 < 0.9)
WEAK = (GOOD[0], [0] * 10 + [1] * 10 + [2] * 8 + [0] * 2)


def test_low_diagonal_fires() -> None:
    out = run(make("Confusion"), [pairs(0, *GOOD), pairs(1, *WEAK)])
    assert out.fired_at == 1
    assert "confusion[2][2]" in out.finding.message and out.finding.value == 0.8


def test_off_diagonal_fires_when_diag_passes() -> None:
    rule = make("Confusion", min_diag="0.5", max_off_diag="0.15")
    assert run(rule, [pairs(0, *WEAK)]).fired_at == 0  # confusion[2][0] = 0.2 > 0.15
    assert "confusion[2][0]" in run(rule, [pairs(0, *WEAK)]).finding.message
    assert run(make("Confusion", min_diag="0.5", max_off_diag="0.25"), [pairs(0, *WEAK)]).fired_at is None


def test_only_fully_populated_matrices_are_judged() -> None:
    labels, preds = [0] * 10 + [1] * 10, [1] * 20  # class 0 all wrong, but class 2 absent
    assert run(make("Confusion", category_no="3"), [pairs(0, labels, preds)]).fired_at is None
    assert run(make("Confusion", category_no="2"), [pairs(0, labels, preds)]).fired_at == 0
    assert run(make("Confusion"), [pairs(0, labels, preds)]).fired_at == 0  # categories seen: 0, 1


def test_names_and_collections() -> None:
    s = pairs(0, *WEAK, names=("y", "yhat"))
    assert run(make("Confusion"), [s]).fired_at is None
    assert run(make("Confusion", labels="y", predictions="yhat"), [s]).fired_at == 0
    t = {"a": tensor([0, 1], ["lab"], values=[0.0, 1.0]), "b": tensor([1, 0], ["pred"], values=[1.0, 0.0])}
    s2 = step_data(0, tensors=t)
    assert run(make("Confusion", labels_collection="lab", predictions_collection="pred"), [s2]).fired_at == 0


def test_parameters() -> None:
    c = make("Confusion", category_no="10", min_diag="0.8", max_off_diag="0.2").config
    assert (c.category_no, c.min_diag, c.max_off_diag, c.labels, c.predictions) == (
        10,
        0.8,
        0.2,
        "labels",
        "predictions",
    )
    assert "min_diag" in config_error("Confusion", min_diag="1.5")
    assert "category_no" in config_error("Confusion", category_no="0")


def test_state_bounded() -> None:
    rule = make("Confusion")
    state, fired = long_run(rule, repeat(pairs(0, *GOOD), SHORT))
    assert fired is None and state.steps_judged == SHORT and state_bytes(rule, state) < 200
