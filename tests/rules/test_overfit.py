"""Golden tests for Overfit: the noise-aware test, and SageMaker's ratio when it is given."""

from __future__ import annotations

from lossfixtures import HEALTHY, fault_job, healthy_job
from rulejobs import LONG, SHORT, M, config_error, fast_step, long_run, make, run, state_bytes, step_data


def epochs(val_by_epoch: list[float], train: float = 1.0, train_steps: int = 4, eval_steps: int = 2) -> list:
    """Each epoch: train_steps TRAIN steps at loss ``train``, then eval_steps EVAL steps."""
    steps, s = [], 0
    for val in val_by_epoch:
        for _ in range(train_steps):
            steps.append(step_data(s, train=train))
            s += 1
        for _ in range(eval_steps):
            steps.append(step_data(s, eval=val))
            s += 1
    return steps


def test_fires_when_evaluation_ratio_exceeds_threshold() -> None:
    # epoch layout: TRAIN 0-3, EVAL 4-5, TRAIN 6-9, EVAL 10-11, TRAIN 12-15, EVAL 16-17
    out = run(make("Overfit", patience="1", ratio_threshold="0.1"), epochs([1.05, 1.08, 1.2]))
    assert out.fired_at == 17  # judged at the end of the job (finish), names the evaluation's last step
    assert abs(out.finding.value - 0.2) < 1e-9 and out.finding.threshold == 0.1
    out = run(make("Overfit", patience="1", ratio_threshold="0.1"), epochs([1.05, 1.2, 1.0]))
    assert out.fired_at == 11 and out.steps_run == 13  # judged when training resumes at step 12


def test_patience_needs_consecutive_evaluations() -> None:
    vals = [1.2, 1.0, 1.2, 1.2, 1.0]
    assert (
        run(make("Overfit", patience="2", ratio_threshold="0.1"), epochs(vals)).fired_at == 23
    )  # third and fourth epochs
    assert run(make("Overfit", patience="3", ratio_threshold="0.1"), epochs(vals)).fired_at is None


def test_start_step_and_ratio_threshold() -> None:
    assert (
        run(
            make("Overfit", patience="1", start_step="12", ratio_threshold="0.1"), epochs([1.5, 1.0])
        ).fired_at
        is None
    )
    assert run(make("Overfit", patience="1", ratio_threshold="0.6"), epochs([1.5])).fired_at is None
    assert run(make("Overfit", patience="1", ratio_threshold="0.4"), epochs([1.5])).fired_at == 5


def test_train_and_eval_in_the_same_step() -> None:
    steps = [step_data(s, train=1.0, eval=1.0 + 0.04 * s) for s in range(5)]
    assert (
        run(make("Overfit", patience="1", ratio_threshold="0.1"), steps).fired_at == 3
    )  # (1.12 - 1) / 1 > 0.1; 1.08 is not


def test_needs_both_modes() -> None:
    assert (
        run(
            make("Overfit", patience="1", ratio_threshold="0.1"), [step_data(s, train=1.0) for s in range(10)]
        ).fired_at
        is None
    )
    assert (
        run(
            make("Overfit", patience="1", ratio_threshold="0.1"), [step_data(s, eval=5.0) for s in range(10)]
        ).fired_at
        is None
    )


def test_parameters() -> None:
    rule = make(
        "Overfit", tensor_regex="val_loss,loss", start_step="100", patience="3", ratio_threshold="0.25"
    )
    c = rule.config
    assert (c.tensor_regex, c.start_step, c.patience, c.ratio_threshold) == (
        ("val_loss", "loss"),
        100,
        3,
        0.25,
    )
    assert "patience" in config_error("Overfit", patience="0")
    assert "ratio_threshold" in config_error("Overfit", ratio_threshold="-0.1")


def test_state_bounded() -> None:
    rule = make("Overfit", patience="1000000", ratio_threshold="0.1")

    def gen():  # 9 TRAIN + 1 EVAL per "epoch", overfitting throughout
        for s in range(SHORT):
            yield fast_step(
                s, {"EVAL": M(None, {"loss": 2.0})} if s % 10 == 9 else {"TRAIN": M(None, {"loss": 1.0})}
            )

    state, fired = long_run(rule, gen())
    assert fired is None and state.over == SHORT // 10 - 1
    assert state_bytes(rule, state) < 1200


def test_noise_aware_state_is_bounded() -> None:
    rule = make("Overfit")

    def gen():  # 9 TRAIN + 1 EVAL per "epoch", the validation loss wobbling, never worse
        for s in range(LONG):
            mode = "EVAL" if s % 10 == 9 else "TRAIN"
            yield fast_step(s, {mode: M(None, {"loss": 1.0 + 0.01 * (s % 7)})})

    state, fired = long_run(rule, gen())
    assert fired is None and state.evaluations == LONG // 10 - 1 and state_bytes(rule, state) < 1500


def test_trainguard_default_patience_is_three_evaluations() -> None:
    assert make("Overfit").config.evaluations == 3
    one_bad = epochs([1.05, 1.5, 1.05, 1.05])
    sm = make("Overfit", ratio_threshold="0.1")
    assert run(sm, one_bad).fired_at is None  # one noisy evaluation is not overfitting
    assert run(sm, epochs([1.05, 1.3, 1.4, 1.5])).fired_at is not None


def test_start_step_counts_training_steps() -> None:
    # an evaluation belongs to the training step it followed: the one at steps 10-11 follows
    # TRAIN mode step 9, before start_step 10 (these helpers number TRAIN mode steps globally)
    out = run(make("Overfit", patience="1", start_step="10", ratio_threshold="0.1"), epochs([1.5, 1.5, 1.5]))
    assert out.fired_at == 17


def test_healthy_loss_shapes_do_not_fire() -> None:
    for shape in HEALTHY:
        for seed in range(3):
            out = run(make("Overfit"), healthy_job(shape, seed))
            assert out.fired_at is None, (shape, seed, out.findings)


def test_a_stable_gap_at_near_zero_training_loss_is_not_overfitting() -> None:
    # validation 0.144 vs training 0.065: SageMaker's ratio (1.2 > 0.1) fires, the gap never grows
    job = healthy_job("near_zero_gap", 0)
    assert run(make("Overfit", ratio_threshold="0.1"), job).fired_at is not None
    assert run(make("Overfit"), job).fired_at is None


def test_a_validation_loss_that_turns_up_while_training_falls_fires() -> None:
    for seed in range(3):
        out = run(make("Overfit"), fault_job("overfit", seed))
        assert out.fired_at is not None and "above its best" in out.finding.message, seed
        # the turn starts at training step 700; evaluations every 100: within 5 of them
        evals = out.state.evaluations
        assert 7 <= evals <= 12, (seed, evals)
