"""The hook with a numpy loop, to a local folder: layout, chain, modes, manifest, end marker."""

import json
import logging
import subprocess
import sys

import numpy as np
import pytest
import trainguard
from trainguard import Collection, SaveConfig, modes
from trainguard.format import layout
from trainguard.format.documents import EndMarker, Manifest, parse_document
from trainguard.hook import stats as stats_module
from trainguard.hook.env import rank_and_world


def numpy_job(out_dir, steps=6, **kwargs):
    """A numpy 'training' loop: a loss, full weights every 2 steps, an EVAL loss at the end."""
    weights = Collection("weights", SaveConfig(save_interval=2), save_full=True)
    rng = np.random.default_rng(0)
    saved = {}
    with trainguard.Hook(out_dir, include_collections=["losses"], collections=[weights], **kwargs) as hook:
        w = rng.normal(size=(4, 3)).astype(np.float32)
        for step in range(steps):
            loss = float(1.0 / (step + 1))
            assert hook.save_scalar("loss", loss, step=step, collections=["losses"])
            if hook.save_tensor("w", w, step=step, collections=["weights"]):
                saved[step] = w.copy()
            w -= 0.1  # in place: the hook must have copied what it stores
        hook.set_mode(modes.EVAL)
        hook.save_scalar("val_loss", 0.5, step=steps - 1, collections=["losses"])
    return saved


def test_numpy_loop_round_trip(tmp_path):
    out = tmp_path / "job-np"
    saved = numpy_job(out)
    trial = trainguard.create_trial(out)
    assert trial.steps() == [0, 1, 2, 3, 4, 5]
    assert trial.steps(mode="EVAL") == [5]
    assert trial.workers() == ["worker_0"] and trial.ranks() == [0]  # smdebug's worker names
    assert trial.tensor("loss").values() == {s: 1.0 / (s + 1) for s in range(6)}
    assert trial.tensor("val_loss").value(5, mode=modes.EVAL) == 0.5
    assert trial.tensor("w").steps() == [0, 2, 4]
    for step, w in saved.items():
        got = trial.tensor("w").value(step)
        assert got.dtype == np.float32 and np.array_equal(got, w)
        assert trial.tensor("w").stats(step).mean == pytest.approx(float(w.astype(np.float64).mean()))
    with pytest.raises(trainguard.trial.TensorUnavailable, match="was not saved at step 1"):
        trial.tensor("w").value(1)
    assert trial.scalars(mode="TRAIN") == {"loss": {s: 1.0 / (s + 1) for s in range(6)}}
    assert trial.tensor_names(collection="losses") == ["loss", "val_loss"]
    # the step object's header: chain and modes
    headers = [trial.header(s) for s in trial.steps()]
    assert [h.prev_step for h in headers] == [None, 0, 1, 2, 3, 4]
    assert set(headers[-1].modes) == {"TRAIN", "EVAL"}
    # an explicit step= is the mode's step too (a plain loop counts its own steps)
    assert headers[-1].modes["EVAL"].mode_step == 5 and headers[-1].modes["TRAIN"].mode_step == 5
    end = trial.end_markers()[0]
    assert (end.last_step, end.steps_written, end.dropped_objects, end.stopped) == (5, 6, 0, False)


def test_layout_keys_and_manifest(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINING_JOB_NAME", "sm-job-1")
    rules = [
        {
            "RuleConfigurationName": "LossNotDecreasing",
            "RuleParameters": {"rule_to_invoke": "LossNotDecreasing"},
        }
    ]
    out = tmp_path / "prefix" / "my-job.1"
    with trainguard.Hook(out, rules=rules, sagemaker_stop=True) as hook:
        hook.save_scalar("loss", 1.0, step=3, collections=["losses"])
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["end/worker-00000.json", "manifest.json", "steps/000000000003/worker-00000.safetensors"]
    manifest = parse_document(Manifest, (out / "manifest.json").read_bytes())
    assert manifest.job == "my-job.1"
    assert manifest.rules == rules
    assert manifest.allow_sagemaker_stop is True
    assert manifest.sagemaker_training_job_name == "sm-job-1"
    assert {c.name for c in manifest.collections} == set(trainguard.CollectionKeys.DEFAULT_INCLUDED)
    grads = next(c for c in manifest.collections if c.name == "gradients")
    assert grads.save_config["TRAIN"].save_interval == 50 and "percentiles" in grads.reductions


def test_default_rules_are_none_and_job_name_override(tmp_path):
    with trainguard.Hook(tmp_path / "x", job_name="other") as hook:
        hook.save_scalar("loss", 1.0, step=0, collections=["losses"])
    manifest = trainguard.create_trial(tmp_path / "x").manifest
    assert manifest.job == "other" and manifest.rules is None


def test_bad_job_name_is_a_clear_error(tmp_path):
    with pytest.raises(layout.LayoutError, match="invalid job name"):
        trainguard.Hook(tmp_path / "bad name!")


def test_multi_worker_layout(tmp_path):
    out = tmp_path / "dist"
    for rank in range(3):
        with trainguard.Hook(out, rank=rank, world_size=3) as hook:
            for step in range(rank, 4):  # worker r starts late: each has its own chain
                hook.save_scalar("loss", float(rank), step=step, collections=["losses"])
    trial = trainguard.create_trial(out)
    assert trial.workers() == ["worker_0", "worker_1", "worker_2"] and trial.ranks() == [0, 1, 2]
    assert trial.steps() == [0, 1, 2, 3]
    assert trial.steps(worker=2) == [2, 3]
    assert trial.header(3, worker=2).prev_step == 2 and trial.header(2, worker=2).prev_step is None
    assert trial.header(3, worker=1).world_size == 3
    assert trial.tensor("loss").value(3, worker=1) == 1.0
    assert (out / "manifest.json").exists()  # rank 0 only writes it
    assert sorted(trial.end_markers()) == [0, 1, 2]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RANK": "2", "WORLD_SIZE": "4"}, (2, 4)),
        ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, (1, 2)),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}, (5, 8)),
        ({"RANK": "9", "WORLD_SIZE": "4"}, (0, 1)),
        ({}, (0, 1)),
    ],
)
def test_rank_from_environment(env, expected):
    assert rank_and_world(env) == expected


def test_rank_from_env_used_by_hook(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with trainguard.Hook(tmp_path / "j") as hook:
        hook.save_scalar("loss", 1.0, step=0, collections=["losses"])
    assert (tmp_path / "j/steps/000000000000/worker-00001.safetensors").exists()
    assert not (tmp_path / "j/manifest.json").exists()


def test_step_counter_without_explicit_steps(tmp_path):
    with trainguard.Hook(tmp_path / "c", include_collections=["losses"]) as hook:
        for i in range(3):
            hook.save_scalar("loss", float(i), collections=["losses"])
            hook.advance_step()
        hook.set_step(10)
        hook.save_scalar("loss", 10.0, collections=["losses"])
    trial = trainguard.create_trial(tmp_path / "c")
    assert trial.steps() == [0, 1, 2, 10]
    assert trial.tensor("loss").value(10) == 10.0


def test_interval_uses_mode_steps(tmp_path):
    cfg = SaveConfig(mode_save_configs={modes.TRAIN: {"save_interval": 2}, modes.EVAL: {"save_interval": 1}})
    with trainguard.Hook(tmp_path / "m", save_config=cfg, include_collections=["losses"]) as hook:
        for step in range(4):
            hook.save_scalar("loss", 1.0, step=step, collections=["losses"])
        hook.set_mode("eval")
        for step in range(4, 6):
            hook.save_scalar("loss", 2.0, step=step, collections=["losses"])
    trial = trainguard.create_trial(tmp_path / "m")
    assert trial.steps(mode="TRAIN") == [0, 2]
    assert trial.steps(mode="EVAL") == [4, 5]
    # explicit step= values are the mode's steps (framework integrations count per mode instead)
    assert [trial.mode_step(s, "EVAL") for s in (4, 5)] == [4, 5]


def test_old_steps_are_ignored_not_overwritten(tmp_path, caplog):
    with trainguard.Hook(tmp_path / "o", include_collections=["losses"]) as hook:
        hook.save_scalar("loss", 1.0, step=5, collections=["losses"])
        hook.save_scalar("loss", 2.0, step=6, collections=["losses"])
        with caplog.at_level(logging.WARNING, logger="trainguard.hook"):
            assert not hook.save_scalar("loss", 3.0, step=5, collections=["losses"])
    assert "ignoring saves for step 5" in caplog.text
    assert trainguard.create_trial(tmp_path / "o").tensor("loss").value(5) == 1.0


def test_bad_arguments_are_skipped_not_raised(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trainguard.hook"), trainguard.Hook(tmp_path / "b") as hook:
        assert not hook.save_scalar("", 1.0, step=0)
        assert not hook.save_scalar("x", [1, 2], step=0)
        assert not hook.save_tensor("c", np.zeros(3, np.complex64), step=0, collections=["weights"])
        assert not hook.save_scalar("y", 1.0, step=-1)
        assert hook.save_scalar("ok", 1.0, step=0)
        assert not hook.disabled
    assert "skipping" in caplog.text


def test_internal_error_disables_hook_once(tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("trainguard.hook.core.numpy_stats", broken)
    with caplog.at_level(logging.ERROR, logger="trainguard.hook"), trainguard.Hook(tmp_path / "e") as hook:
        hook.save_scalar("loss", 1.0, step=0, collections=["losses"])
        for step in range(5):  # the training loop carries on; later calls are no-ops
            assert hook.save_tensor("w", np.ones(3), step=step, collections=["weights"]) is False
            hook.save_scalar("loss", 1.0, step=step, collections=["losses"])
        assert hook.disabled
    assert caplog.text.count("the hook disables itself") == 1
    assert "RuntimeError: boom" in caplog.text
    # what was saved before the error still reaches the job folder, and the end marker too
    assert (tmp_path / "e/end/worker-00000.json").exists()


def test_writer_thread_error_disables_hook(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(stats_module.PendingStats, "finalize", lambda self: 1 / 0)
    import torch

    with caplog.at_level(logging.ERROR, logger="trainguard.hook"), trainguard.Hook(tmp_path / "w") as hook:
        hook.save_tensor("t", torch.ones(3), step=0, collections=["weights"])
        hook.set_step(1)
        hook._uploader.close(5)
        assert hook.disabled
    assert "background writer" in caplog.text
    end = parse_document(EndMarker, (tmp_path / "w/end/worker-00000.json").read_bytes())
    assert end.dropped_objects == 1


def test_import_is_light():
    code = (
        "import sys, trainguard; "
        "h = trainguard.Hook; t = trainguard.create_trial; "
        "print(json.dumps(['torch' in sys.modules, 'boto3' in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == [False, False]
