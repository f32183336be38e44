"""LossConverged (opt-in): the converged plateau LossNotDecreasing does not alert on."""

from __future__ import annotations

from lossfixtures import fault_job, healthy_job
from rulejobs import LONG, M, config_error, fast_step, long_run, make, run, state_bytes
from trainguard.rules.config import DEFAULT_RULES


def test_a_converged_plateau_is_signalled_and_a_stall_is_not() -> None:
    for seed in range(3):
        out = run(make("LossConverged", mode="TRAIN"), healthy_job("converged_plateau", seed))
        # at its floor by step ~300: 4 blocks of 50 later, or a little more
        assert out.fired_at is not None and "has converged" in out.finding.message
        assert out.finding.step <= 800, out.finding.step
        assert (
            run(make("LossNotDecreasing", mode="TRAIN"), healthy_job("converged_plateau", seed)).fired_at
            is None
        )
        # a loss that never fell has not converged (a decline that stopped at once may read as
        # converged at one block and stopped at the next: for early stopping both end the gains)
        assert run(make("LossConverged", mode="TRAIN"), fault_job("stall_from_start", seed)).fired_at is None


def test_a_loss_still_falling_has_not_converged() -> None:
    # (a slow power-law decline under 10% noise reads as converged once its fall over 4 blocks
    # is within its noise: that is what "converged" means here)
    for shape in ("cosine_restarts", "gan", "warmup"):
        out = run(make("LossConverged", mode="TRAIN"), healthy_job(shape, 0)[:1500])
        assert out.fired_at is None, (shape, out.findings)


def test_opt_in_and_parameters() -> None:
    assert "LossConverged" not in DEFAULT_RULES
    assert "diff_percent" in config_error("LossConverged", diff_percent="0")
    rule = make("LossConverged", num_steps="5000")
    steps = (fast_step(s, {"TRAIN": M(None, {"loss": 1e6 - s})}) for s in range(LONG))
    state, fired = long_run(rule, steps)
    assert fired is None and state_bytes(rule, state) < 2048
