"""Golden tests for SimilarAcrossRuns (pure logic: ``compare`` is called with both jobs' steps)."""

from __future__ import annotations

import numpy as np
import pytest
from rulejobs import SHORT, config_error, make, state_bytes, step_data, tensor


def job_step(step: int, w: np.ndarray) -> object:
    return step_data(
        step,
        tensors={
            "weights/fc.weight": tensor(w, ["weights"]),
            "gradients/fc.weight": tensor(w * 0.1, ["gradients"]),
        },
    )


def compare_jobs(rule, a: list, b: list) -> int | None:
    state = rule.initial_state()
    for sa, sb in zip(a, b):
        state, found = rule.update(state, sa)
        assert not found  # update alone never fires
        state, found = rule.compare(state, sa, sb)
        if found:
            return found[0].step
    return None


def test_identical_runs_do_not_fire() -> None:
    w = np.arange(6.0)
    a = [job_step(s, w + s) for s in range(5)]
    b = [job_step(s, w + s) for s in range(5)]
    assert compare_jobs(make("SimilarAcrossRuns", other_trials="job-b"), a, b) is None


def test_diverging_runs_fire_at_first_difference() -> None:
    w = np.arange(6.0)
    a = [job_step(s, w + s) for s in range(5)]
    b = [job_step(s, w + s + (0.01 if s >= 3 else 0)) for s in range(5)]
    rule = make("SimilarAcrossRuns", other_trials="job-b")
    assert compare_jobs(rule, a, b) == 3
    _, found = rule.compare(rule.initial_state(), a[3], b[3])
    assert "job-b" in found[0].message and found[0].tensor == "weights/fc.weight"
    # only gradients selected: they differ too (0.001), weights not looked at
    assert (
        compare_jobs(make("SimilarAcrossRuns", other_trials="job-b", collection_names="biases"), a, b) is None
    )


def test_compare_needs_the_same_step() -> None:
    rule = make("SimilarAcrossRuns", other_trials="job-b")
    with pytest.raises(ValueError):
        rule.compare(rule.initial_state(), job_step(1, np.ones(2)), job_step(2, np.ones(2)))


def test_parameters() -> None:
    rule = make("SimilarAcrossRuns", other_trials="job-b,job-c", tensor_regex="weights/.*")
    assert rule.config.other_trials == ("job-b", "job-c") and rule.config.other_job == "job-b"
    assert rule.kind == "cross-job"
    assert "other_trials" in config_error("SimilarAcrossRuns")
    assert "other_trials" in config_error("SimilarAcrossRuns", other_trials="None")


def test_state_bounded() -> None:
    rule = make("SimilarAcrossRuns", other_trials="job-b")
    s = job_step(0, np.ones(3))
    state = rule.initial_state()
    for _ in range(SHORT):
        state, _ = rule.compare(state, s, s)
    assert state.steps_compared == SHORT and state_bytes(rule, state) < 200
