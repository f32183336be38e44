"""Golden tests: Dataloader (workers below 70 % or above 200 % of the cores)."""

from __future__ import annotations

from sysbatches import run, series
from trainguard.format.system import DataloaderInfo
from trainguard.rules.profiler import Dataloader


def make(**params: str) -> Dataloader:
    return Dataloader(Dataloader.Config.model_validate(params))


def test_defaults_are_sagemakers() -> None:
    cfg = Dataloader.Config()
    assert (cfg.min_threshold, cfg.max_threshold) == (70, 200)


def test_too_few_workers_fire_on_the_first_batch_that_says_so() -> None:
    batches = series(40) + series(40, t0=2e6, dataloader=DataloaderInfo(num_workers=2, cpu_count=8))
    _, found = run(make(), batches)
    assert [i for i, _ in found] == [2]
    assert found[0][1].value == 25.0 and "below min_threshold" in found[0][1].message


def test_too_many_workers_fire() -> None:
    _, found = run(make(), series(20, dataloader=DataloaderInfo(num_workers=20, cpu_count=8)))
    assert found and found[0][1].value == 250.0 and "above max_threshold" in found[0][1].message


def test_balanced_workers_do_not_fire_and_wait_is_summed() -> None:
    rule = make()
    state, found = run(rule, series(40, dataloader=DataloaderInfo(num_workers=8, cpu_count=8)))
    assert found == []
    assert rule.notes(state)["num_workers"] == 8


def test_no_dataloader_info_is_not_applicable() -> None:
    rule = make()
    state, found = run(rule, series(40))
    assert found == [] and "no data-loader information" in rule.notes(state)["note"]


def test_timed_data_waits_alone_are_not_a_judgement() -> None:
    """Without the loader's workers the rule judged nothing: its verdict is Error, never a pass."""
    rule = make()
    state, _ = run(rule, series(40))
    coverage = rule.coverage(state)
    assert not coverage.complete and "no data-loader workers" in coverage.reason
    state, _ = run(rule, series(40, dataloader=DataloaderInfo(num_workers=8, cpu_count=8)))
    assert rule.coverage(state).complete
    assert rule.coverage(rule.initial_state()).reason == "no system batches were received"
