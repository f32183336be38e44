"""Writing to S3 (moto server on 127.0.0.1), a slow, failing or missing store, spill and retry, stop."""

import json
import logging
import time

import numpy as np
import pytest
import torch
import trainguard
from hook_fakes import FlakyStore
from segment_reader import JobView
from torch import nn
from trainguard.format import layout
from trainguard.format.documents import EndMarker, StopSignal, dump_document, parse_document
from trainguard.hook.storage import S3Store, parse_s3_url


def numpy_loop(hook, steps, size=64, start=0):
    w = np.arange(size, dtype=np.float32)
    for step in range(start, start + steps):
        hook.save_scalar("loss", float(step), step=step, collections=["losses"])
        hook.save_tensor("w", w + step, step=step, collections=["weights"])


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


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
    # full weights are due at every step: each step's window closes at once ("full")
    assert keys == [
        "jobs/np-job/end/worker-00000.json",
        "jobs/np-job/manifest.json",
        *["jobs/np-job/" + layout.segment_key(0, s, s, s) for s in range(4)],
    ]
    job = JobView(url)
    assert job.steps() == [0, 1, 2, 3]
    np.testing.assert_array_equal(job.value("w", 3), np.arange(64, dtype=np.float32) + 3)
    assert job.scalars()["loss"] == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0}

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
    job = JobView(url)
    assert job.steps() == [0, 1, 2]
    assert job.scalar("CrossEntropyLoss_output_0", 2) == pytest.approx(losses[2].item())
    assert "gradient/Sequential_0.weight" in job.tensor_names(step=0)


def test_one_tensor_is_read_with_ranged_gets(s3):
    _, bucket = s3
    url = f"s3://{bucket}/jobs/ranged"
    big = np.random.default_rng(0).normal(size=(256, 256)).astype(np.float32)
    with full_weights_hook(url) as hook:
        hook.save_tensor("big", big, step=0, collections=["weights"])
        hook.save_tensor("small", np.ones(3, np.float32), step=0, collections=["weights"])
    store = FlakyStore(S3Store(url))
    job = JobView(store)
    (segment,) = job.segments()
    store.ranges.clear()
    np.testing.assert_array_equal(job.value("small", 0), np.ones(3, np.float32))
    ((key, start, end),) = store.ranges
    assert key == segment.key and end - start == 12  # only the 3 floats, not the 256 KiB tensor


def test_slow_store_does_not_block_training(flaky_local):
    store = flaky_local(delay_s=0.2)
    hook = full_weights_hook(store.url, store=store, window_s=0.2)
    numpy_loop(hook, 10)
    written_while_training = len(store.puts)
    report = hook.close()
    assert report.ok
    # the loop returned before the store had its objects (0.2 s each): saves never waited for PUTs
    assert written_while_training < report.segments <= len(store.puts)
    job = JobView(store.inner)
    assert job.steps() == list(range(10))
    assert job.end_markers()[0].dropped_objects == 0


def test_failing_store_spills_and_retries_nothing_lost(flaky_local, tmp_path, caplog):
    store = flaky_local(failing=True)
    spill = tmp_path / "spill"
    with caplog.at_level(logging.INFO, logger="trainguard.hook"):
        hook = full_weights_hook(store.url, store=store, spill_dir=spill, flush_timeout_s=20, window_s=0.2)
        hook._delivery.backoff_initial_s = hook._delivery.backoff_max_s = 0.05
        for step in range(8):
            numpy_loop(hook, 1, start=step)
            hook.flush()  # one segment per step, so that several wait while the store is down
            assert wait_for(lambda step=step: hook.segments_written > step)
        assert wait_for(lambda: hook.upload_stats.spilled >= 5)
        assert list(spill.rglob("*segments__*")), "objects must be on disk while the store is down"
        assert store.failed
        store.failing.clear()  # S3 is back
        report = hook.close()
    assert report.ok
    assert "simulated outage" in caplog.text and "retrying" in caplog.text
    assert "works again" in caplog.text
    job = JobView(store.inner)
    assert job.steps() == list(range(8))
    segments = job.segments()
    assert [s.header.seq for s in segments] == list(range(len(segments)))
    end = job.end_markers()[0]
    assert end.dropped_objects == 0 and end.steps_written == 8
    assert not any(spill.rglob("*segments__*")), "delivered spill files are removed"


def test_undeliverable_objects_are_counted_and_reported(flaky_local, tmp_path, caplog, capsys):
    store = flaky_local(fail_prefix="segments/")
    with caplog.at_level(logging.ERROR, logger="trainguard.hook"):
        hook = full_weights_hook(store.url, store=store, spill_dir=tmp_path / "spill", flush_timeout_s=0.5)
        for step in range(3):
            numpy_loop(hook, 1, start=step)
            hook.flush()
            assert wait_for(lambda step=step: hook.segments_written > step)
        report = hook.close()
    end = parse_document(EndMarker, store.inner.get(layout.end_key(0)))
    assert not report.ok and report.undelivered == end.dropped_objects and end.dropped_objects >= 1
    assert end.last_step == 2 and end.segments == report.segments
    assert "NOT everything reached" in caplog.text and "were not delivered" in caplog.text
    assert report.spill_dir and list((tmp_path / "spill").rglob("*segments__*"))  # kept for a later upload


def test_a_missing_bucket_is_said_plainly_at_the_first_write_and_at_close(s3, caplog):
    """The README's example with a bucket that does not exist: plain words, twice, fast."""
    _, bucket = s3
    url = f"s3://no-such-{bucket}/jobs/readme-job"
    with caplog.at_level(logging.WARNING, logger="trainguard.hook"):
        hook = trainguard.Hook(url, flush_timeout_s=30, stop_check_interval_s=0, window_s=0.2)
        for step in range(20):
            hook.save_scalar("loss", 1.0, step=step)
        assert wait_for(lambda: hook.upload_stats.first_error is not None)
        started = time.monotonic()
        report = hook.close()
        closing = time.monotonic() - started
    first = next(r for r in caplog.records if "does not exist" in r.getMessage())
    assert first.levelname == "ERROR"
    assert f"the bucket no-such-{bucket} does not exist" in first.getMessage()
    assert "Nothing this job records reaches the service" in first.getMessage()
    assert not report.ok and report.undelivered >= 2 and not report.end_marker_written
    assert report.error and "does not exist" in report.error
    assert closing < 15, "a permanent failure must not keep close() retrying for the whole timeout"
    summary = caplog.records[-1].getMessage()
    assert "NOT everything reached" in summary and "were not delivered" in summary


def test_flush_is_bounded(flaky_local):
    store = flaky_local(delay_s=2.0)
    hook = full_weights_hook(store.url, store=store, flush_timeout_s=0.3)
    numpy_loop(hook, 3)
    started = time.perf_counter()
    report = hook.close()
    # the outcome: close() gave up at its flush timeout and said what it could not deliver
    assert report.undelivered >= 1 and not report.ok
    assert time.perf_counter() - started < 60  # a safety net only (the bound is the timeout)


def test_describe_failure_in_plain_words():
    from botocore.exceptions import ClientError, NoCredentialsError
    from trainguard.hook.storage import StoreError, describe_failure

    def client_error(code):
        return ClientError({"Error": {"Code": code, "Message": "x"}}, "PutObject")

    url = "s3://bucket/jobs/j"
    wrapped = StoreError("PUT failed")
    wrapped.__cause__ = client_error("NoSuchBucket")
    assert describe_failure(url, wrapped) == (
        True,
        "cannot write to s3://bucket/jobs/j: the bucket bucket does not exist",
    )
    assert describe_failure(url, client_error("AccessDenied"))[0] is True
    assert "s3:PutObject" in describe_failure(url, client_error("AccessDenied"))[1]
    assert describe_failure(url, NoCredentialsError()) == (
        True,
        "cannot write to s3://bucket/jobs/j: no AWS credentials were found (NoCredentialsError)",
    )
    assert describe_failure(url, client_error("SlowDown"))[0] is False
    assert describe_failure("/ro", PermissionError(13, "Permission denied"))[0] is True


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
