"""The hook's profiler: system batches and step timings a stalled data loader shows up in."""

import time

import trainguard
from segment_reader import JobView
from trainguard.engine.replay import replay
from trainguard.engine.sources import LocalJob

RULES = [{"RuleConfigurationName": "StepOutlier", "RuleParameters": {"rule_to_invoke": "StepOutlier"}}]


def slow_loader(n: int):
    for i in range(n):
        if i % 20 == 19:
            time.sleep(0.15)  # the loader stalls
        yield i


def test_a_stalled_loader_is_caught_by_step_outlier(tmp_path):
    out = tmp_path / "prof"
    with trainguard.Hook(
        out, rules=RULES, profiler=0.1, profiler_flush_s=1.0, stop_check_interval_s=0
    ) as hook:
        for i in hook.timed_loader(slow_loader(420)):
            hook.save_scalar("loss", 1.0 / (i + 1), step=i, collections=["losses"])
            time.sleep(0.002)
    job = JobView(out)
    assert job.manifest.system_interval_s == 0.1
    end = job.end_markers()[0]
    assert end.system_batches is not None and end.system_batches >= 1
    systems = sorted(p.name for p in (out / "system" / "worker-00000").iterdir())
    assert len(systems) == end.system_batches
    result = replay(LocalJob.open(out))
    record = result.state.rule("StepOutlier")
    assert record.status == "IssuesFound", record.details
    assert result.state.finished


def test_without_profiler_nothing_is_sampled_and_the_loader_is_unchanged(tmp_path):
    data = [1, 2, 3]
    with trainguard.Hook(tmp_path / "noprof", stop_check_interval_s=0) as hook:
        assert hook.timed_loader(data) is data
        hook.save_scalar("loss", 1.0, step=0, collections=["losses"])
    assert not (tmp_path / "noprof" / "system").exists()
    assert JobView(tmp_path / "noprof").end_markers()[0].system_batches is None
