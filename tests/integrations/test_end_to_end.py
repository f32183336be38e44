"""Each callback under `trainguard local`: a real fault (an absurd learning rate, no gradient
clipping) in the example scripts, judged by the real handlers on moto, alerted, and stopped
through the framework after a checkpoint; and the clean twin of each, replayed: no issues."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from trainguard import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CASES = {
    "huggingface": ("huggingface_train.py", "transformers"),
    "lightning": ("lightning_train.py", "lightning"),
    "keras": ("keras_train.py", "keras"),
}


def trainguard_cli(*args: str, timeout: float = 800) -> subprocess.CompletedProcess:
    """The ``trainguard`` command in its own process (as a user runs it; the local mode's moto
    backends are per process)."""
    env = dict(os.environ, KERAS_BACKEND="torch", PYTHONUNBUFFERED="1")
    command = [sys.executable, "-c", "import sys; from trainguard.cli import main; sys.exit(main())", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def needs(module: str) -> None:
    if importlib.util.find_spec(module) is None or importlib.util.find_spec("torch") is None:
        pytest.skip(f"{module} is not installed (its trainguard extra)")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("framework", sorted(CASES))
def test_an_absurd_learning_rate_is_caught_alerted_and_stopped(framework, tmp_path):
    script, module = CASES[framework]
    needs(module)
    job = f"{framework}-lr"
    checkpoints = tmp_path / "checkpoints"
    command = [sys.executable, str(EXAMPLES / script), "--fault", "lr", "--checkpoints", str(checkpoints)]
    done = trainguard_cli("local", "--job", job, "--", *command)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    fired = re.search(rf"● {job} / ExplodingTensor: InProgress → IssuesFound at step (\d+)", out)
    assert fired, out[-3000:]
    # what fired is the loss as computed (for the Trainer: the value its own log hides)
    assert re.search(r"scalar loss \(worker 0, TRAIN\) is (nan|inf|-inf)", out), out[-3000:]
    assert f"SNS → email (delivered): trainguard: ExplodingTensor IssuesFound in {job}" in out
    stopped = re.search(r"trainguard stopped training at step (\d+) \(rule ExplodingTensor", out)
    assert stopped, out[-3000:]
    stop_step = int(stopped.group(1))
    assert stop_step >= int(fired.group(1))
    assert f"{job} (Stopped, last step" in out
    saved = sorted(p.name for p in checkpoints.iterdir())
    if framework == "huggingface":
        assert f"checkpoint-{stop_step}" in saved  # saved at the step it stopped at
    elif framework == "lightning":
        assert any(f"step={stop_step}.ckpt" in name for name in saved), saved
    else:  # Keras ends the epoch where it stopped (64 steps each), then ModelCheckpoint saves it
        stop_epoch = -(-stop_step // 64)
        assert saved[-1] == f"epoch-{stop_epoch}.weights.h5" and len(saved) == stop_epoch, (stop_step, saved)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("framework", sorted(CASES))
def test_the_clean_twin_has_no_issues(framework, tmp_path, capsys, monkeypatch):
    script, module = CASES[framework]
    needs(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    job = tmp_path / f"{framework}-clean"
    # each example at its shipped length: what its docstring promises is what a user gets
    command = [sys.executable, str(EXAMPLES / script), "--out", str(job), "--pace", "0"]
    command += ["--checkpoints", str(tmp_path / "checkpoints")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "trainguard stopped" not in done.stdout
    capsys.readouterr()
    assert cli.main(["replay", "--json", "--no-progress", str(job)]) == 0
    verdicts = {
        r["RuleConfigurationName"]: r["RuleEvaluationStatus"] for r in json.loads(capsys.readouterr().out)
    }
    assert verdicts and all(status == "NoIssuesFound" for status in verdicts.values()), verdicts
