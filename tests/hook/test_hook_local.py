"""The hook with a numpy loop, to a local folder: layout, chains, modes, manifest, end marker,
explicit saves, loss names, ``Hook()`` from the environment, errors contained and counted."""

import itertools
import json
import logging
import subprocess
import sys

import numpy as np
import pytest
import trainguard
from segment_reader import JobView
from trainguard import Collection, SaveConfig, modes
from trainguard.format import layout
from trainguard.format.documents import Manifest, parse_document
from trainguard.hook import env
from trainguard.hook import stats as stats_module
from trainguard.hook.env import rank_and_world


def numpy_job(out_dir, steps=6, **kwargs):
    """A numpy 'training' loop: a loss and the weights every step, an EVAL loss at the end."""
    weights = Collection("weights", SaveConfig(save_interval=2), save_full=True)
    rng = np.random.default_rng(0)
    saved = {}
    with trainguard.Hook(out_dir, include_collections=["losses"], collections=[weights], **kwargs) as hook:
        w = rng.normal(size=(4, 3)).astype(np.float32)
        for step in range(steps):
            assert hook.save_scalar("loss", float(1.0 / (step + 1)), step=step)
            assert hook.save_tensor("w", w, step=step, collections=["weights"])
            saved[step] = w.copy()
            w -= 0.1  # in place: the hook must have copied what it stores
        hook.set_mode(modes.EVAL)
        hook.save_scalar("val_loss", 0.5, step=steps - 1)
    return saved


def test_numpy_loop_round_trip(tmp_path):
    out = tmp_path / "job-np"
    saved = numpy_job(out)
    job = JobView(out)
    assert job.steps() == [0, 1, 2, 3, 4, 5]
    assert job.steps(mode="EVAL") == [5]
    assert job.workers() == [0]
    assert job.scalars()["loss"] == {s: 1.0 / (s + 1) for s in range(6)}
    assert job.scalar("val_loss", 5, mode="EVAL") == 0.5
    # explicit saves are written at every step, due or not, with the full tensor (as smdebug)
    assert job.tensor_steps("w") == [0, 1, 2, 3, 4, 5]
    for step, w in saved.items():
        got = job.value("w", step)
        assert got.dtype == np.float32 and np.array_equal(got, w)
        assert job.stats("w", step).mean == pytest.approx(float(w.astype(np.float64).mean()))
    # names say what they are: both scalars count as losses
    assert job.mode(5, "TRAIN").scalars["loss"].collections == ["losses"]
    assert job.mode(5, "EVAL").scalars["val_loss"].collections == ["losses"]
    # an explicit step= is the mode's step too (a plain loop counts its own steps)
    assert job.mode(5, "EVAL").mode_step == 5 and job.mode(5, "TRAIN").mode_step == 5
    end = job.end_markers()[0]
    assert (end.last_step, end.steps_written, end.dropped_objects, end.stopped) == (5, 6, 0, False)
    assert end.segments == len(job.segments()) and end.dropped == {}


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
        hook.save_scalar("loss", 1.0, step=3)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == [
        "end/worker-00000.json",
        "manifest.json",
        layout.segment_key(0, 0, 3, 3),
    ]
    manifest = parse_document(Manifest, (out / "manifest.json").read_bytes())
    assert manifest.job == "my-job.1"
    assert manifest.rules == rules
    assert manifest.allow_sagemaker_stop is True
    assert manifest.sagemaker_training_job_name == "sm-job-1"
    # only what LossNotDecreasing reads (losses) and the scalar collections are on
    assert {c.name for c in manifest.collections} == {"losses", "metrics", "scalars"}


def test_default_hook_turns_on_what_the_default_rules_read(tmp_path):
    hook = trainguard.Hook(tmp_path / "d", stop_check_interval_s=0)
    # LossNotDecreasing/Overfit: losses; VanishingGradient: gradients; DeadRelu: relu_output
    assert {"losses", "gradients", "relu_output"} <= set(hook.collections)
    assert "weights" not in hook.collections  # no default rule reads weights
    hook.close()


def test_default_rules_are_none_and_job_name_override(tmp_path):
    with trainguard.Hook(tmp_path / "x", job_name="other") as hook:
        hook.save_scalar("loss", 1.0, step=0)
    manifest = JobView(tmp_path / "x").manifest
    assert manifest.job == "other" and manifest.rules is None


def test_bad_job_name_is_a_clear_error(tmp_path):
    with pytest.raises(layout.LayoutError, match="invalid job name"):
        trainguard.Hook(tmp_path / "bad name!")


@pytest.mark.parametrize(
    ("name", "collection"),
    [
        ("loss", "losses"),
        ("val_loss", "losses"),
        ("my_loss", "losses"),
        ("CrossEntropyLoss_output_0", "losses"),
        ("trainLoss", "losses"),
        ("loss/train", "losses"),
        ("loss_scale", "scalars"),
        ("accuracy", "scalars"),
        ("glossary", "scalars"),
    ],
)
def test_scalar_names_that_say_loss_count_as_losses(tmp_path, name, collection):
    with trainguard.Hook(tmp_path / "n", include_collections=["metrics"]) as hook:
        assert hook.save_scalar(name, 1.0, step=0)
    record = JobView(tmp_path / "n").mode(0).scalars[name]
    assert record.collections == [collection]


def test_explicit_saves_are_written_at_steps_that_are_not_due(tmp_path):
    """Save configs throttle what the hook captures itself, never an explicit save."""
    every50 = SaveConfig(save_interval=50)
    with trainguard.Hook(
        tmp_path / "e", include_collections=["losses"], collections=[Collection("gradients", every50)]
    ) as hook:
        grad = np.full((3, 3), 0.5, np.float32)
        grad[0, 0] = np.nan
        assert hook.save_tensor("g", grad, collections=["gradients"], step=3)  # not due at step 3
        # a collection that is off (labels) and scalars without collections=["losses"]
        assert hook.save_tensor("y", np.arange(4), collections=["labels"], step=3)
        assert hook.save_scalar("my_loss", 2.0, step=3)
        assert hook.save_scalar("lr", 0.1, step=3)
    job = JobView(tmp_path / "e")
    g = job.stats("g", 3)
    assert g.nan == 1 and g.numel == 9
    assert np.isnan(job.value("g", 3)[0, 0])
    assert job.record("y", 3).collections == ["labels"]
    assert job.scalars(collection="losses") == {"my_loss": {3: 2.0}}
    assert job.scalars(collection="scalars") == {"lr": {3: 0.1}}
    assert job.end_markers()[0].dropped == {}


def test_save_tensor_without_the_full_tensor(tmp_path):
    full_every_2 = Collection("weights", SaveConfig(save_interval=2), save_full=True)
    with trainguard.Hook(tmp_path / "f", collections=[full_every_2]) as hook:
        for step in range(3):
            hook.save_tensor("w", np.ones(5), collections=["weights"], step=step, full=False)
    job = JobView(tmp_path / "f")
    # statistics only, except where the save_full collection is due (steps 0 and 2)
    assert [job.record("w", s).stored for s in range(3)] == [True, False, True]
    assert job.stats("w", 1).mean == 1.0


def test_multi_worker_chains(tmp_path):
    out = tmp_path / "dist"
    for rank in range(3):
        with trainguard.Hook(out, rank=rank, world_size=3, window_s=0.2 + rank) as hook:
            for step in range(rank, 4):  # worker r starts late: each has its own chain
                hook.save_scalar("loss", float(rank), step=step)
    job = JobView(out)
    assert job.workers() == [0, 1, 2]
    assert job.steps() == [0, 1, 2, 3]
    assert job.steps(worker=2) == [2, 3]
    for rank in range(3):
        segments = job.segments(rank)
        assert [s.header.seq for s in segments] == list(range(len(segments)))
        assert segments[0].header.prev_step is None
        for before, after in itertools.pairwise(segments):
            assert after.header.prev_step == before.header.last_step
        assert all(s.header.world_size == 3 for s in segments)
        assert job.end_markers()[rank].segments == len(segments)
    assert job.scalar("loss", 3, worker=1) == 1.0
    assert (out / "manifest.json").exists()  # rank 0 only writes it


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"RANK": "2", "WORLD_SIZE": "4"}, (2, 4)),
        ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, (1, 2)),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}, (5, 8)),
        ({"RANK": "9", "WORLD_SIZE": "4"}, (0, 1)),
        ({}, (0, 1)),
    ],
)
def test_rank_from_environment(environ, expected):
    assert rank_and_world(environ) == expected


def test_rank_from_env_used_by_hook(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with trainguard.Hook(tmp_path / "j") as hook:
        hook.save_scalar("loss", 1.0, step=0)
    assert (tmp_path / "j" / layout.segment_key(1, 0, 0, 0)).exists()
    assert not (tmp_path / "j/manifest.json").exists()


# ----------------------------------------------------------------------------- Hook() from the environment
def test_hook_without_out_dir_uses_trainguard_out_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINGUARD_OUT_DIR", str(tmp_path / "from-env"))
    with trainguard.Hook() as hook:
        hook.save_scalar("loss", 1.0, step=0)
    assert hook.job_name == "from-env"
    assert JobView(tmp_path / "from-env").steps() == [0]


def test_hook_without_out_dir_on_sagemaker(tmp_path, monkeypatch):
    config = tmp_path / "debughookconfig.json"
    config.write_text(
        json.dumps({"S3OutputPath": "s3://my-bucket/jobs", "LocalPath": "/opt/ml/output/tensors"})
    )
    monkeypatch.delenv("TRAINGUARD_OUT_DIR", raising=False)
    monkeypatch.setenv("TRAINING_JOB_NAME", "pytorch-training-2026-12-01")
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(config))
    assert env.resolve_out_dir() == (
        "s3://my-bucket/jobs/pytorch-training-2026-12-01",
        "pytorch-training-2026-12-01",
    )
    # the path already naming the job is used as it is
    config.write_text(json.dumps({"S3OutputPath": "s3://b/jobs/pytorch-training-2026-12-01/"}))
    assert env.resolve_out_dir()[0] == "s3://b/jobs/pytorch-training-2026-12-01"


def test_hook_without_out_dir_anywhere_names_both_ways(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINGUARD_OUT_DIR", raising=False)
    monkeypatch.delenv("TRAINING_JOB_NAME", raising=False)
    with pytest.raises(env.OutDirMissing) as info:
        trainguard.Hook()
    text = str(info.value)
    assert "TRAINGUARD_OUT_DIR" in text and "TRAINING_JOB_NAME" in text and "S3OutputPath" in text
    monkeypatch.setenv("TRAINING_JOB_NAME", "sm-job")
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(tmp_path / "missing.json"))
    with pytest.raises(env.OutDirMissing, match=r"SageMaker training job 'sm-job'.*no S3OutputPath"):
        trainguard.Hook()


# ----------------------------------------------------------------------------- steps
def test_step_counter_without_explicit_steps(tmp_path):
    with trainguard.Hook(tmp_path / "c", include_collections=["losses"]) as hook:
        for i in range(3):
            hook.save_scalar("loss", float(i))
            hook.advance_step()
        hook.set_step(10)
        hook.save_scalar("loss", 10.0)
    job = JobView(tmp_path / "c")
    assert job.steps() == [0, 1, 2, 10]
    assert job.scalar("loss", 10) == 10.0


def test_captured_values_follow_mode_steps(tmp_path):
    """What an integration records (record_scalar) is throttled by the save config, per mode step."""
    cfg = SaveConfig(mode_save_configs={modes.TRAIN: {"save_interval": 2}, modes.EVAL: {"save_interval": 1}})
    with trainguard.Hook(tmp_path / "m", save_config=cfg, include_collections=["losses"]) as hook:
        for _ in range(4):
            assert hook.plan() is not None
            hook.record_scalar("loss", 1.0, ["losses"])
            hook.advance_step()
        hook.set_mode("eval")
        for _ in range(2):
            plan = hook.plan()
            assert plan is not None and plan.mode is modes.EVAL and plan.wants("losses")
            hook.record_scalar("loss", 2.0, ["losses"])
            hook.advance_step()
    job = JobView(tmp_path / "m")
    assert job.steps(mode="TRAIN") == [0, 2]
    assert job.steps(mode="EVAL") == [4, 5]
    assert [job.mode(s, "EVAL").mode_step for s in (4, 5)] == [0, 1]


def test_old_steps_are_counted_not_overwritten(tmp_path, caplog):
    with trainguard.Hook(tmp_path / "o", include_collections=["losses"]) as hook:
        hook.save_scalar("loss", 1.0, step=5)
        hook.save_scalar("loss", 2.0, step=6)
        with caplog.at_level(logging.WARNING, logger="trainguard.hook"):
            assert not hook.save_scalar("loss", 3.0, step=5)
        assert hook.dropped == {"step_already_written": 1}
    assert "ignoring saves for step 5" in caplog.text
    job = JobView(tmp_path / "o")
    assert job.scalar("loss", 5) == 1.0
    assert job.end_markers()[0].dropped == {"step_already_written": 1}


def test_bad_arguments_are_skipped_counted_not_raised(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trainguard.hook"), trainguard.Hook(tmp_path / "b") as hook:
        assert not hook.save_scalar("", 1.0, step=0)
        assert not hook.save_scalar("x", [1, 2], step=0)
        assert not hook.save_tensor("c", np.zeros(3, np.complex64), step=0, collections=["weights"])
        assert not hook.save_scalar("y", 1.0, step=-1)
        assert hook.save_scalar("ok", 1.0, step=0)
        assert not hook.disabled
    assert "skipping" in caplog.text
    report = hook.close()
    assert report.dropped == {"invalid_name": 1, "not_a_scalar": 1, "unsupported_value": 1, "bad_argument": 1}
    assert JobView(tmp_path / "b").end_markers()[0].dropped == report.dropped


def test_internal_error_disables_hook_once(tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("trainguard.hook.core.numpy_stats", broken)
    with caplog.at_level(logging.ERROR, logger="trainguard.hook"), trainguard.Hook(tmp_path / "e") as hook:
        hook.save_scalar("loss", 1.0, step=0)
        for step in range(5):  # the training loop carries on; later calls are no-ops
            assert hook.save_tensor("w", np.ones(3), step=step, collections=["weights"]) is False
            hook.save_scalar("loss", 1.0, step=step)
        assert hook.disabled
    assert caplog.text.count("the hook disables itself") == 1
    assert "RuntimeError: boom" in caplog.text
    # what was saved before the error still reaches the job folder, and the end marker too
    job = JobView(tmp_path / "e")
    assert job.scalar("loss", 0) == 1.0 and 0 in job.end_markers()


def test_writer_thread_error_disables_hook_and_counts(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(stats_module.PendingStats, "finalize", lambda self: 1 / 0)
    import torch

    with caplog.at_level(logging.ERROR, logger="trainguard.hook"):
        hook = trainguard.Hook(tmp_path / "w")
        hook.save_tensor("t", torch.ones(3), step=0, collections=["weights"])
        report = hook.close()
    assert hook.disabled
    assert "background writer" in caplog.text
    assert report.dropped == {"writer_failed": 1}
    assert JobView(tmp_path / "w").end_markers()[0].dropped == {"writer_failed": 1}


def test_dry_run_writes_nothing(tmp_path):
    with trainguard.Hook(tmp_path / "dry", dry_run=True) as hook:
        assert hook.save_scalar("loss", 1.0, step=0) is False
    assert not (tmp_path / "dry").exists()


def test_get_hook_and_del_hook(tmp_path):
    hook = trainguard.Hook(tmp_path / "g")
    assert trainguard.get_hook() is hook
    trainguard.del_hook()
    assert trainguard.get_hook() is None
    hook.close()


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


def test_saves_after_close_are_counted_and_ignored(tmp_path, caplog):
    hook = trainguard.Hook(tmp_path / "late")
    hook.save_scalar("loss", 1.0, step=0)
    hook.close()
    with caplog.at_level(logging.WARNING, logger="trainguard.hook"):
        assert hook.save_scalar("loss", 2.0, step=1) is False
    assert "after close()" in caplog.text and hook.dropped == {"after_close": 1}
    assert JobView(tmp_path / "late").steps() == [0]
