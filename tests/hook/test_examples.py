"""The examples run and write a complete job."""

import runpy
from pathlib import Path

import pytest
from segment_reader import JobView

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "loss"), [("numpy_loop.py", "mse"), ("torch_loop.py", "CrossEntropyLoss_output_0")]
)
def test_example_writes_a_readable_job(tmp_path, monkeypatch, script, loss):
    monkeypatch.chdir(tmp_path)
    module = runpy.run_path(str(EXAMPLES / script))
    assert module["main"](str(tmp_path / "job"), steps=30) == 0
    job = JobView(tmp_path / "job")
    assert job.steps()[0] == 0
    assert len(job.scalars()[loss]) == 30
    end = job.end_markers()[0]
    assert end.dropped_objects == 0 and end.dropped == {}
