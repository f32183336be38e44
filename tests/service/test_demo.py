"""`trainguard demo` end to end: the README's first command must keep telling the truth."""

import pytest
from trainguard.local.demo import run_demo


@pytest.mark.slow
def test_demo_alerts_and_stops_the_faulty_job_and_passes_the_clean_twin(capsys, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)  # the demo writes runs/<job>-profiler-report.html
    assert run_demo(fault="exploding", steps=100, quiet=True) == 0
    out = capsys.readouterr().out
    assert "✓ demo-exploding: ExplodingTensor found issues" in out and "the job was stopped" in out
    assert "✓ demo-slow-loader: StepOutlier caught the stalled data loader" in out
    assert "✓ demo-clean-twin: every rule NoIssuesFound" in out
    assert "SNS → email (delivered): trainguard: ExplodingTensor IssuesFound in demo-exploding" in out
    assert (tmp_path / "runs" / "demo-slow-loader-profiler-report.html").stat().st_size > 10_000
