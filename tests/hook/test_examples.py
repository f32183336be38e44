"""The examples run, write a job, and the trial API reads it back."""

import runpy
from pathlib import Path

import pytest
import trainguard

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "loss"), [("numpy_loop.py", "mse"), ("torch_loop.py", "CrossEntropyLoss_output_0")]
)
def test_example_writes_a_readable_job(tmp_path, monkeypatch, script, loss):
    monkeypatch.chdir(tmp_path)
    module = runpy.run_path(str(EXAMPLES / script))
    assert module["main"](str(tmp_path / "job"), steps=30) == 0
    trial = trainguard.create_trial(tmp_path / "job")
    assert trial.steps()[0] == 0
    assert len(trial.tensor(loss).values(mode="TRAIN")) == 30
    assert trial.end_markers()[0].dropped_objects == 0
