"""Writing to S3 (moto server on 127.0.0.1), a slow and a failing store, spill and retry, stop."""

import json
import logging
import threading
import time

import numpy as np
import pytest
import torch
import trainguard
from torch import nn
from trainguard.format import layout
from trainguard.format.documents import EndMarker, StopSignal, dump_document, parse_document
from trainguard.hook.storage import S3Store, parse_s3_url
from trainguard.hook.uploader import Uploader


def numpy_loop(hook, steps, size=64):
    w = np.arange(size, dtype=np.float32)
    for step in range(steps):
        hook.save_scalar("loss", float(step), step=step, collections=["losses"])
        hook.save_tensor("w", w + step, step=step, collections=["weights"])


def full_weights_hook(out_dir, **kwargs):
    every = trainguard.SaveConfig(save_interval=1)
    return trainguard.Hook(
        out_dir,
        include_collections=["losses"],
        collections=[trainguard.Collection("weights", every, save_full=True)],
        **kwargs,
    )


def test_parse_s3_url():
    assert parse_s3_url("s3://b/jobs/x/") == ("b", "jobs/x")
    assert parse_s3_url("s3://b") == ("b", "")
    with pytest.raises(ValueError, match="no bucket"):
        parse_s3_url("s3:///x")


def test_numpy_and_torch_loops_to_s3(s3):
    client, bucket = s3
    url = f"s3://{bucket}/jobs/np-job"
    with full_weights_hook(url) as hook:
        numpy_loop(hook, 4)
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == [
        "jobs/np-job/end/worker-00000.json",
        "jobs/np-job/manifest.json",
        *[f"jobs/np-job/steps/{s:012d}/worker-00000.safetensors" for s in range(4)],
    ]
    trial = trainguard.create_trial(url)
    assert trial.steps() == [0, 1, 2, 3]
    np.testing.assert_array_equal(trial.tensor("w").value(3), np.arange(64, dtype=np.float32) + 3)
    assert trial.tensor("loss").values() == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0}

    torch.manual_seed(0)
    model, crit = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), nn.CrossEntropyLoss()
    url = f"s3://{bucket}/jobs/torch-job"
    with trainguard.Hook(url) as hook:
        hook.register_module(model)
        hook.register_loss(crit)
        losses = []
        for _ in range(3):
            loss = crit(model(torch.randn(8, 4)), torch.randint(0, 2, (8,)))
            loss.backward()
            losses.append(loss)
    trial = trainguard.create_trial(url)
    assert trial.steps() == [0, 1, 2]
    assert trial.tensor("CrossEntropyLoss_output_0").value(2) == pytest.approx(losses[2].item())
    assert "gradient/0.weight" in trial.tensor_names(step=0)


def test_trial_reads_one_tensor_with_ranged_gets(s3, tmp_path):
    from hook_fakes import FlakyStore

    _, bucket = s3
    url = f"s3://{bucket}/jobs/ranged"
    big = np.random.default_rng(0).normal(size=(256, 256)).astype(np.float32)
    with full_weights_hook(url) as hook:
        hook.save_tensor("big", big, step=0, collections=["weights"])
        hook.save_tensor("small", np.ones(3, np.float32), step=0, collections=["weights"])
    store = FlakyStore(S3Store(url))
    trial = trainguard.create_trial(url, store=store)
    np.testing.assert_array_equal(trial.tensor("small").value(0), np.ones(3, np.float32))
    key = layout.step_key(0, 0)
    header_read, tensor_read = store.ranges
    assert header_read == (key, 0, 64 * 1024)
    assert tensor_read[2] - tensor_read[1] == 12  # only the 3 floats, not the 256 KiB tensor


def test_slow_store_does_not_block_training(flaky_local):
    store = flaky_local(delay_s=0.2)
    hook = full_weights_hook(store.url, store=store)
    started = time.perf_counter()
    numpy_loop(hook, 10)
    elapsed = time.perf_counter() - started
    assert elapsed < 0.5, f"10 saves took {elapsed:.2f}s with a store taking 0.2s per PUT"
    hook.close()
    trial = trainguard.create_trial(store.url)
    assert trial.steps() == list(range(10))
    assert trial.end_markers()[0].dropped_objects == 0


def test_failing_store_spills_and_retries_nothing_lost(flaky_local, tmp_path, caplog):
    store = flaky_local(failing=True)
    spill = tmp_path / "spill"
    with caplog.at_level(logging.INFO, logger="trainguard.hook"):
        hook = full_weights_hook(store.url, store=store, spill_dir=spill, flush_timeout_s=20)
        hook._uploader._backoff_initial = hook._uploader._backoff_max = 0.05
        started = time.perf_counter()
        numpy_loop(hook, 8)
        assert time.perf_counter() - started < 0.5
        deadline = time.monotonic() + 10
        while hook.upload_stats.spilled < 7 and time.monotonic() < deadline:
            time.sleep(0.02)
        spilled_files = list(spill.rglob("*steps__*"))
        assert spilled_files, "objects must be on disk while the store is down"
        assert store.failed
        store.failing.clear()  # S3 is back
        hook.close()
    assert "spilling to disk and retrying" in caplog.text
    assert "works again" in caplog.text
    trial = trainguard.create_trial(store.url)
    assert trial.steps() == list(range(8))
    assert [trial.header(s).prev_step for s in range(8)] == [None, 0, 1, 2, 3, 4, 5, 6]
    end = trial.end_markers()[0]
    assert end.dropped_objects == 0 and end.steps_written == 8
    assert not any(spill.rglob("*steps__*")), "delivered spill files are removed"


def test_undeliverable_objects_are_counted_in_the_end_marker(flaky_local, tmp_path, caplog):
    store = flaky_local(fail_prefix="steps/")
    with caplog.at_level(logging.ERROR, logger="trainguard.hook"):
        hook = full_weights_hook(store.url, store=store, spill_dir=tmp_path / "spill", flush_timeout_s=0.5)
        numpy_loop(hook, 3)
        hook.close()
    end = parse_document(EndMarker, store.inner.get(layout.end_key(0)))
    assert end.dropped_objects == 3 and end.last_step == 2
    assert "3 objects could not be delivered" in caplog.text
    assert "spilled objects kept in" in caplog.text
    assert len(list((tmp_path / "spill").rglob("*steps__*"))) == 3  # kept for a later upload


def test_full_queue_drops_and_counts_without_blocking(flaky_local, caplog):
    store = flaky_local()
    gate = threading.Event()

    def slow_encode(item):
        gate.wait(5)
        return None

    up = Uploader(store, slow_encode, queue_size=2)
    with caplog.at_level(logging.WARNING, logger="trainguard.hook"):
        results = [up.submit(object()) for _ in range(6)]
    assert results.count(False) >= 3 and up.stats.dropped == results.count(False)
    assert "dropped" in caplog.text
    gate.set()
    assert up.close(5) == 0


def test_flush_is_bounded(flaky_local):
    store = flaky_local(delay_s=2.0)
    hook = full_weights_hook(store.url, store=store, flush_timeout_s=0.3)
    numpy_loop(hook, 3)
    started = time.perf_counter()
    hook.close()
    assert time.perf_counter() - started < 2.0 + 3 * 0.2 + 2.5  # timeout + one PUT in flight + end marker


def write_stop(store):
    signal = StopSignal(
        job=store.url.rsplit("/", 1)[-1], rule="LossNotDecreasing", reason="flat", requested_at=0.0
    )
    store.put(layout.STOP_SIGNAL, dump_document(signal))


def test_stop_signal_raises_once_at_a_save_call(flaky_local):
    store = flaky_local()
    hook = trainguard.Hook(store.url, store=store, stop_check_interval_s=0.05)
    hook.save_scalar("loss", 1.0, step=0, collections=["losses"])
    write_stop(store.inner)
    deadline = time.monotonic() + 5
    while not hook.should_stop and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hook.should_stop and hook.stop_signal.rule == "LossNotDecreasing"
    with pytest.raises(trainguard.StopTrainingRequested, match="LossNotDecreasing: flat"):
        hook.save_scalar("loss", 1.0, step=1, collections=["losses"])
    hook.save_scalar("loss", 1.0, step=2, collections=["losses"])  # raised once: checkpointing may save
    hook.close()
    assert json.loads(store.inner.get(layout.end_key(0)))["stopped"] is True


def test_stop_signal_raises_in_forward_pre_hook(flaky_local):
    store = flaky_local()
    model = nn.Linear(2, 2)
    with trainguard.Hook(store.url, store=store, stop_check_interval_s=0.05) as hook:
        hook.register_module(model)
        model(torch.zeros(1, 2))
        write_stop(store.inner)
        deadline = time.monotonic() + 5
        while not hook.should_stop and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(trainguard.StopTrainingRequested):
            model(torch.zeros(1, 2))
        model(torch.zeros(1, 2))


def test_stop_signal_polling_style(flaky_local):
    store = flaky_local()
    with trainguard.Hook(store.url, store=store, stop_check_interval_s=0.05, raise_on_stop=False) as hook:
        write_stop(store.inner)
        deadline = time.monotonic() + 5
        step = 0
        while not hook.should_stop and time.monotonic() < deadline:
            hook.save_scalar("loss", 1.0, step=step, collections=["losses"])
            step += 1
            time.sleep(0.01)
        assert hook.should_stop


def test_a_missing_stop_signal_under_a_no_list_policy_reads_as_absent():
    """S3 answers 403, not 404, for a missing key when the role may not list the bucket."""
    import boto3
    from botocore.stub import Stubber
    from trainguard.hook.storage import S3Store

    client = boto3.client("s3", region_name="us-east-1")
    store = S3Store("s3://bucket/jobs/j", client=client)
    with Stubber(client) as stub:
        stub.add_client_error("head_object", service_error_code="403", http_status_code=403)
        assert store.exists("control/stop.json") is False
