"""`trainguard demo` end to end: the README's first command must keep telling the truth.

The verdicts are outcomes (statuses, the stop, exit codes), never timings; the stalled loader's
stalls are sized from the step times the machine gives, so load cannot flip them.
"""

import json
import re

import pytest
from trainguard.local.demo import run_demo


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a safety net: about 2 minutes on 2 quiet cores, far more on a crowded machine
def test_demo_alerts_and_stops_the_faulty_job_and_passes_the_clean_twin(capsys, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)  # the demo keeps its jobs under runs/
    assert run_demo(fault="exploding", steps=100, quiet=True) == 0
    out = capsys.readouterr().out
    assert "✓ demo-exploding: ExplodingTensor found issues" in out and "the job was stopped" in out
    assert "✓ demo-slow-loader: StepOutlier caught the stalled data loader" in out
    assert "✓ demo-clean-twin: every rule NoIssuesFound" in out
    assert "SNS → email (delivered): trainguard: ExplodingTensor IssuesFound in demo-exploding" in out
    assert "(global), TRAIN step" in out and "is inf" in out
    runs = tmp_path / "runs"
    for job in ("demo-exploding", "demo-slow-loader", "demo-clean-twin"):
        assert (runs / job / "manifest.json").is_file(), job
        status = json.loads((runs / "_trainguard" / f"{job}.status.json").read_text())
        assert status["TrainingJobName"] == job and status["Finished"], job
    assert (runs / "demo-slow-loader" / "report" / "profiler-report.html").stat().st_size > 10_000
    assert f"kept in {'runs'}/" in out and "next: trainguard status" in out
    # the summary lists the jobs in the order they ran, not by name
    titles = re.findall(r"^(demo-[a-z-]+) \(", out, flags=re.MULTILINE)
    assert titles == ["demo-exploding", "demo-slow-loader", "demo-clean-twin"]
