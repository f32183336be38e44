"""SageMaker's hook configuration (DebugHookConfig / debughookconfig.json) -> Hook settings."""

from __future__ import annotations

import json

import pytest
import trainguard
from segment_reader import JobView
from trainguard.hook.sagemaker import hook_settings, load_hook_config
from trainguard.modes import ModeKeys

#: a CreateTrainingJob request's DebugHookConfig as the SageMaker SDK sends it (strings)
REQUEST = {
    "S3OutputPath": "s3://my-bucket/jobs",
    "LocalPath": "/opt/ml/output/tensors",
    "HookParameters": {"save_interval": "100", "train.save_interval": "10", "export_tensorboard": "true"},
    "CollectionConfigurations": [
        {
            "CollectionName": "gradients",
            "CollectionParameters": {"save_interval": "5", "reductions": "abs_mean,max"},
        },
        {"CollectionName": "weights", "CollectionParameters": {"eval.save_steps": "1,2"}},
        {"CollectionName": "relu_activations", "CollectionParameters": {"include_regex": "relu.*_output_0"}},
    ],
}


def test_a_create_training_job_request_maps_to_hook_settings():
    s = hook_settings(REQUEST, job_name="train-2026-12-01")
    assert s.out_dir == "s3://my-bucket/jobs/train-2026-12-01" and s.job_name == "train-2026-12-01"
    assert s.save_config.get_save_config(ModeKeys.TRAIN).save_interval == 10
    assert s.save_config.get_save_config(ModeKeys.EVAL).save_interval == 100
    assert s.include_collections == ["losses", "gradients", "weights", "relu_activations"]
    cols = {c.name: c for c in s.collections}
    # a collection's plain value beats the hook's per-mode one; its own per-mode value beats both
    assert cols["gradients"].save_config.get_save_config(ModeKeys.TRAIN).save_interval == 5
    assert cols["gradients"].statistics == ("mean_abs", "max") and not cols["gradients"].save_full
    weights = cols["weights"].save_config
    assert weights.get_save_config(ModeKeys.EVAL).save_steps == (1, 2)
    assert weights.get_save_config(ModeKeys.TRAIN).save_interval == 10
    assert cols["weights"].save_full  # no reductions: the tensor itself, as smdebug saves it
    assert cols["relu_activations"].include_regex == ["relu.*_output_0"]
    assert "HookParameters.export_tensorboard" in s.ignored


def test_values_may_be_numbers_as_in_smdebugs_json_examples():
    s = hook_settings({"LocalPath": "/tmp/x", "HookParameters": {"save_interval": 7, "save_all": True}})
    assert s.out_dir == "/tmp/x" and s.save_all is True
    assert s.save_config.get_save_config(ModeKeys.GLOBAL).save_interval == 7


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"S3OutputPath": "my-bucket/jobs"}, "must be an s3:// URL"),
        ({"HookParameters": {"save_interval": "often"}}, "save_interval must be an integer"),
        ({"HookParameters": {"save_interval": "0"}}, "save_interval must be positive"),
        ({"HookParameters": {"save_steps": "1,x"}}, "save_steps must be comma-separated integers"),
        ({"HookParameters": {"save_alll": "true"}}, "unknown parameter 'save_alll'"),
        ({"HookParameters": {"save_all": "maybe"}}, "save_all must be true or false"),
        ({"CollectionConfigurations": [{"CollectionParameters": {}}]}, "needs a CollectionName"),
        ({"CollectionConfigurations": {"CollectionName": "x"}}, "must be a list"),
        ({"Typo": 1}, "unknown DebugHookConfig keys"),
    ],
)
def test_bad_configurations_are_clear_errors(config, message):
    with pytest.raises(ValueError, match=message):
        hook_settings(config)


def test_the_config_file_is_bounded_and_must_be_json(tmp_path):
    path = tmp_path / "debughookconfig.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        load_hook_config(path)
    path.write_bytes(b" " * (1024 * 1024 + 10))
    with pytest.raises(ValueError, match="not a hook configuration"):
        load_hook_config(path)
    assert load_hook_config(tmp_path / "none.json", missing_ok=True) is None


def test_create_from_json_file_on_sagemaker(tmp_path, monkeypatch):
    """The file SageMaker writes, read by the hook in the training container."""
    out = tmp_path / "tensors"
    path = tmp_path / "debughookconfig.json"
    path.write_text(
        json.dumps(
            {
                "LocalPath": str(out),
                "HookParameters": {"save_interval": "2"},
                "CollectionConfigurations": [{"CollectionName": "losses"}],
            }
        )
    )
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(path))
    monkeypatch.setenv("TRAINING_JOB_NAME", "sm-job-7")
    hook = trainguard.Hook.create_from_json_file()
    assert hook.job_name == "sm-job-7" and hook.out_dir == str(out / "sm-job-7")
    for step in range(4):
        hook.save_scalar("loss", float(step), step=step)
    hook.close()
    assert JobView(out / "sm-job-7").scalars()["loss"] == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0}
    manifest = JobView(out / "sm-job-7").manifest
    assert manifest.sagemaker_training_job_name == "sm-job-7"
    losses = next(c for c in manifest.collections if c.name == "losses")
    assert losses.save_config["TRAIN"].save_interval == 2
