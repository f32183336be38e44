"""Golden tests for WeightUpdateRatio."""

from __future__ import annotations

import numpy as np
from rulejobs import LONG, config_error, long_run, make, repeat, run, state_bytes, step_data, tensor
from trainguard.rules.weight_update_ratio import MAX_TRACKED


def training(updates: list[float | None], steps: list[int] | None = None, workers: int = 1) -> list:
    """A weight tensor W with ||W|| = 2 at every save; ``updates`` gives ||W_s - W_prev||."""
    w = np.full((2, 2), 1.0)  # l2 = 2
    out = []
    for i, u in enumerate(updates):
        t = {
            "weights/fc.weight": tensor(w, ["weights"], update_l2=u),
            "gradients/fc.weight": tensor(w, ["gradients"]),
        }
        out.append(
            step_data((steps or list(range(0, 10 * len(updates), 10)))[i], tensors=t, workers=[t] * workers)
        )
    return out


def test_huge_update_fires() -> None:
    out = run(make("WeightUpdateRatio"), training([None, 0.02, 0.1, 25.0]))
    assert out.fired_at == 30
    assert abs(out.finding.value - 25.0 / (2.0 + 1e-9)) < 1e-9 and out.finding.threshold == 10.0
    assert "large_threshold" in out.finding.message and "step 20 -> 30" in out.finding.message


def test_tiny_update_fires() -> None:
    out = run(make("WeightUpdateRatio"), training([None, 0.02, 0.0]))
    assert out.fired_at == 20 and out.finding.threshold == 1e-8


def test_an_eval_save_of_the_weights_is_not_an_update() -> None:
    """Weights saved during evaluation equal the last training step's: the hook's update_l2 is
    0 there, which is no sign of a stalled layer."""
    w = np.full((2, 2), 1.0)
    steps = [
        step_data(0, tensors={"weights/fc.weight": tensor(w, ["weights"], update_l2=None)}),
        step_data(10, tensors={"weights/fc.weight": tensor(w, ["weights"], update_l2=0.02)}),
        step_data(
            14, tensors={"weights/fc.weight": tensor(w, ["weights"], update_l2=0.0)}, mode="EVAL", mode_step=0
        ),
        step_data(20, tensors={"weights/fc.weight": tensor(w, ["weights"], update_l2=0.02)}),
    ]
    out = run(make("WeightUpdateRatio"), steps)
    assert out.fired_at is None
    assert (out.state.ratios_checked, out.state.tensors_seen) == (2, 3)  # the EVAL save is not read


def test_first_save_and_missing_update_are_not_judged() -> None:
    assert run(make("WeightUpdateRatio"), training([0.0, None, None])).fired_at is None


def test_num_steps_limits_the_gap() -> None:
    steps = training([None, 100.0], steps=[0, 50])
    assert run(make("WeightUpdateRatio"), steps).fired_at == 50
    assert run(make("WeightUpdateRatio", num_steps="20"), steps).fired_at is None
    assert run(make("WeightUpdateRatio", num_steps="50"), steps).fired_at == 50


def test_parameters() -> None:
    c = make(
        "WeightUpdateRatio", num_steps="None", large_threshold="5", small_threshold="1e-6", epsilon="1e-7"
    ).config
    assert (c.num_steps, c.large_threshold, c.small_threshold, c.epsilon) == (None, 5.0, 1e-6, 1e-7)
    assert "small_threshold" in config_error("WeightUpdateRatio", small_threshold="20")
    assert "num_steps" in config_error("WeightUpdateRatio", num_steps="-3")


def test_state_bounded_by_tracked_tensors() -> None:
    rule = make("WeightUpdateRatio")
    many = {
        f"weights/layer{i:04d}.weight": tensor(np.ones(2), ["weights"], update_l2=0.01) for i in range(300)
    }
    state, fired = long_run(rule, (step_data(s, tensors=many) for s in range(3)))
    assert len(state.prev_l2) == MAX_TRACKED and state.untracked == 300 - MAX_TRACKED
    assert state_bytes(rule, state) < 8192

    state, fired = long_run(rule, repeat(training([0.01])[0], LONG))
    assert fired is None and state_bytes(rule, state) < 300
