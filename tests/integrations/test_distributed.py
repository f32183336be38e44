"""The Hugging Face callback under DDP: two CPU processes (gloo) launched by torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the [huggingface] extra is not installed")

import trainguard

JOB = Path(__file__).with_name("ddp_huggingface_job.py")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_rank_records_its_worker_and_all_stop_at_the_same_step(tmp_path):
    job = tmp_path / "ddp-job"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += [str(JOB), str(job), str(tmp_path)]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    done = subprocess.run(command, capture_output=True, text=True, timeout=800, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    # rank 1 never looked for the signal itself, yet stopped at rank 0's step: one decision
    assert [r["hook_saw_stop"] for r in ranks] == [True, False]
    assert [r["global_step"] for r in ranks] == [4, 4]
    assert [r["stopped_at_step"] for r in ranks] == [4, 4]
    trial = trainguard.create_trial(job)
    assert trial.workers() == [0, 1]
    assert trial.manifest.world_size == 2
    for worker in (0, 1):
        assert trial.steps(mode="TRAIN", worker=worker) == [1, 2, 3, 4]
        assert worker in trial.end_markers()
    # each worker's own batches: the two ranks' losses differ
    losses = [trial.tensor("loss").values(mode="TRAIN", worker=w) for w in (0, 1)]
    assert losses[0][1] != losses[1][1]
    # the Trainer's metrics (already reduced across ranks) come from rank 0 only
    assert "learning_rate" in trial.tensor_names(worker=0)
    assert "learning_rate" not in trial.tensor_names(worker=1)
