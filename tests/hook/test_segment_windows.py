"""Segment windows: each close reason, the chain, the size bound, a 5,000 steps/s loop, memory."""

import math
import struct
import threading
import time

import numpy as np
import pytest
import torch
import trainguard
from hook_fakes import FlakyStore
from segment_reader import JobView
from trainguard import Collection, SaveConfig
from trainguard.format import layout, stepfile
from trainguard.format.documents import SegmentHeader, TensorStats, decode_segment_header
from trainguard.hook.segments import ModeBuffer, PendingTensor, SegmentBuilder, StepRecord
from trainguard.hook.storage import LocalStore
from trainguard.hook.uploader import Delivery
from trainguard.hook.writer import DropCounter, SegmentWriter


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def record(step, scalars=None, tensors=None, full_due=False, mode="TRAIN"):
    buf = ModeBuffer(step)
    for name, value in (scalars or {"loss": 1.0}).items():
        buf.scalars[name] = (value, ["losses"])
    for name, pending in (tensors or {}).items():
        buf.tensors[name] = pending
    return StepRecord(step, 1000.0 + step, {mode: buf}, full_due=full_due)


def builder(clock, **kwargs):
    drops = kwargs.pop("drops", None)
    return SegmentBuilder(
        "job",
        0,
        1,
        window_s=kwargs.pop("window_s", 1.0),
        wall_clock=clock,
        monotonic=clock,
        take_dropped=drops.take_new if drops is not None else None,
        **kwargs,
    )


def decoded(segment) -> SegmentHeader:
    header, _ = decode_segment_header(segment.data, object_size=len(segment.data))
    return header


def header_bytes(data: bytes) -> int:
    return 8 + struct.unpack("<Q", data[:8])[0]


def test_window_closes_on_time_and_the_chain_links():
    clock = Clock()
    b = builder(clock, window_s=1.0)
    assert b.add(record(0)) == [] and b.add(record(1)) == []
    clock.t += 0.6
    assert b.add(record(2)) == []
    clock.t += 0.5  # 1.1 s since the window opened: the next step closes it first
    (first,) = b.add(record(3))
    assert (first.seq, first.first_step, first.last_step, first.reason) == (0, 0, 2, "time")
    assert first.key == layout.segment_key(0, 0, 0, 2)
    header = decoded(first)  # validated by the contract's model
    assert [s.step for s in header.steps] == [0, 1, 2] and header.prev_step is None
    assert header.opened <= header.closed
    clock.t += 1.0
    second = b.expired()  # the writer's timer: no new step needed
    assert second is not None and second.reason == "time"
    header = decoded(second)
    assert (header.seq, header.prev_step, header.first_step) == (1, 2, 3)
    assert b.expired() is None and b.close("close") is None


def test_window_closes_before_the_header_passes_its_target():
    clock = Clock()
    target = 8 * 1024
    b = builder(clock, window_s=60, header_target_bytes=target)
    segments = []
    for step in range(400):
        segments += b.add(record(step, {f"metric_{i}": float(i) for i in range(5)}))
    segments.append(b.close("close"))
    assert len(segments) > 5
    assert all(s.reason == "size" for s in segments[:-1])
    for s in segments:
        assert header_bytes(s.data) <= target  # one bounded GET reads every header
    steps = [st.step for s in segments for st in decoded(s).steps]
    assert steps == list(range(400))


def test_a_single_step_larger_than_the_target_gets_its_own_segment():
    clock = Clock()
    b = builder(clock, window_s=60, header_target_bytes=2048)
    assert b.add(record(0)) == []
    big = {f"scalar_number_{i:04d}": float(i) for i in range(200)}
    (closed,) = b.add(record(1, big))  # closes the window holding step 0 first
    assert (closed.first_step, closed.last_step, closed.reason) == (0, 0, "size")
    (alone,) = b.add(record(2))
    assert (alone.first_step, alone.last_step) == (1, 1) and header_bytes(alone.data) > 2048


def test_full_tensors_due_and_non_finite_values_close_at_once():
    clock = Clock()
    b = builder(clock, window_s=60)
    full = PendingTensor(["weights"], "float32", [2, 2], None, np.ones((2, 2), np.float32))
    assert b.add(record(0)) == []
    (seg,) = b.add(record(1, tensors={"w": full}, full_due=True))
    assert (seg.first_step, seg.last_step, seg.reason) == (0, 1, "full")
    _, parsed = decode_segment_header(seg.data, len(seg.data))
    assert list(parsed.tensors) == ["000000000001/TRAIN/w"]
    (nan,) = b.add(record(2, {"loss": math.nan}))
    assert nan.reason == "nonfinite"
    stats = TensorStats(numel=4, nan=0, inf=1)
    (inf,) = b.add(record(3, tensors={"g": PendingTensor(["gradients"], "float32", [4], stats)}))
    assert inf.reason == "nonfinite"
    assert decoded(inf).steps[0].modes["TRAIN"].tensors["g"].stats.inf == 1


def test_body_limit_closes_before_a_step_whose_tensors_do_not_fit():
    clock = Clock()
    b = builder(clock, window_s=60, body_limit_bytes=100_000)
    blob = PendingTensor(["default"], "float32", [10_000], None, np.zeros(10_000, np.float32))
    assert b.add(record(0, tensors={"t": blob})) == []
    assert b.add(record(1, tensors={"t": blob})) == []  # 80 kB
    (seg,) = b.add(record(2, tensors={"t": blob}))
    assert (seg.last_step, seg.reason) == (1, "size")


def test_drops_are_carried_by_the_segment_of_their_window():
    clock = Clock()
    drops = DropCounter()
    b = builder(clock, drops=drops)
    b.add(record(0))
    drops.add("invalid_name", 2)
    first = b.close("close")
    b.add(record(1))
    second = b.close("close")
    assert decoded(first).dropped == {"invalid_name": 2} and decoded(second).dropped == {}
    assert drops.totals() == {"invalid_name": 2}


@pytest.mark.parametrize(
    "value",
    [
        np.arange(6, dtype=np.float16).reshape(2, 3),
        np.arange(6, dtype=np.int8),
        np.array([True, False]),
        np.arange(4, dtype=np.uint64),
        np.array(3.5, dtype=np.float64),
        np.zeros((0, 3), np.float32),
        torch.arange(6, dtype=torch.bfloat16),
    ],
    ids=["f16", "i8", "bool", "u64", "0d", "empty", "bf16"],
)
def test_full_tensors_of_every_dtype_round_trip(tmp_path, value):
    with trainguard.Hook(tmp_path / "dt", stop_check_interval_s=0) as hook:
        assert hook.save_tensor("t", value, step=0)
    got = JobView(tmp_path / "dt").value("t", 0)
    want = value.float().numpy() if isinstance(value, torch.Tensor) else value
    assert got.shape == want.shape and np.array_equal(got.astype(np.float64), want.astype(np.float64))


# ----------------------------------------------------------------------------- through the hook
def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_nan_is_written_at_once_even_with_a_long_window(tmp_path):
    out = tmp_path / "nan"
    hook = trainguard.Hook(out, window_s=60, stop_check_interval_s=0)
    for step in range(3):
        hook.save_scalar("loss", 1.0, step=step)
    hook.save_scalar("loss", float("nan"), step=3)
    hook.save_scalar("loss", 1.0, step=4)  # step 3 is sealed when step 4 begins
    try:
        assert wait_for(lambda: JobView(out).segments()), "the NaN step must not wait 60 s"
        (seg,) = JobView(out).segments()
        assert (seg.header.last_step, seg.header.reason) == (3, "nonfinite")
        assert math.isnan(seg.header.steps[-1].modes["TRAIN"].scalars["loss"].value)
    finally:
        hook.close()


def test_a_window_closes_on_time_without_new_steps(tmp_path):
    out = tmp_path / "time"
    hook = trainguard.Hook(out, window_s=0.2, stop_check_interval_s=0)
    hook.save_scalar("loss", 1.0, step=0)
    hook.save_scalar("loss", 1.0, step=1)  # seals step 0; then the training loop is busy elsewhere
    try:
        assert wait_for(lambda: JobView(out).segments())
        (seg,) = JobView(out).segments()
        assert seg.header.reason == "time" and seg.header.last_step == 0
    finally:
        hook.close()
    last = JobView(out).segments()[-1].header
    assert (last.reason, last.last_step) == ("close", 1)


def test_full_tensors_due_close_the_window(tmp_path):
    out = tmp_path / "full"
    full = Collection("weights", SaveConfig(save_interval=3), save_full=True)
    with trainguard.Hook(out, include_collections=["losses"], collections=[full], window_s=60) as hook:
        for step in range(7):
            plan = hook.plan(step)
            assert plan is not None
            hook.record_scalar("loss", 1.0, ["losses"])
            hook.record_tensor("w", np.full(4, step, np.float32), ["weights"])
    reasons = [(s.header.first_step, s.header.last_step, s.header.reason) for s in JobView(out).segments()]
    assert reasons == [(0, 0, "full"), (1, 3, "full"), (4, 6, "full")]


def test_a_5000_steps_per_second_scalar_loop_loses_nothing(tmp_path):
    out = tmp_path / "fast"
    steps = 20_000
    hook = trainguard.Hook(out, include_collections=["losses"], stop_check_interval_s=0, flush_timeout_s=600)
    with hook:  # (a generous close timeout: a loaded machine encodes slowly, nothing may be lost)
        for step in range(steps):
            hook.save_scalar("loss", 1.0 / (step + 1), step=step)
    job = JobView(out)
    assert job.steps() == list(range(steps))
    end = job.end_markers()[0]
    assert (end.steps_written, end.dropped_objects, end.dropped) == (steps, 0, {})
    segments = job.segments()
    assert end.segments == len(segments) and len(segments) < steps / 100
    assert all(header_bytes((out / s.key).read_bytes()[:8]) <= stepfile.SEGMENT_PROBE_BYTES for s in segments)
    assert all(s.header.reason in ("time", "size", "close") for s in segments)


def test_memory_is_bounded_in_bytes_with_backpressure_not_drops(tmp_path):
    """Big full tensors faster than a slow store takes them: the training thread waits, nothing is lost."""
    store = FlakyStore(LocalStore(tmp_path / "slow"), delay_s=0.05)
    drops = DropCounter()
    b = SegmentBuilder("slow", 0, 1, window_s=60, take_dropped=drops.take_new)
    delivery = Delivery(store, memory_bytes=1 << 20, spill_dir=tmp_path / "spill")
    cap = 2 * 1024 * 1024
    writer = SegmentWriter(b, delivery, drops, max_bytes=cap, batch_s=0.01)
    size = 256 * 1024
    for step in range(60):
        tensor = np.full(size // 4, step, np.float32)
        rec = record(step, tensors={"t": PendingTensor(["weights"], "float32", [size // 4], None, tensor)})
        rec.full_due = True
        rec.nbytes = size
        assert writer.submit(rec)
    writer.close(60)
    report = delivery.close(60)
    assert writer.peak_bytes <= cap + size
    assert report.undelivered == 0 and drops.totals() == {}
    job = JobView(store.inner)
    assert job.steps() == list(range(60))
    assert float(job.value("t", 59)[0]) == 59.0


def test_workers_with_different_windows_write_complete_chains(tmp_path):
    out = tmp_path / "multi"

    def worker(rank: int) -> None:
        window = [0.2, 0.5, 5.0][rank]
        with trainguard.Hook(out, rank=rank, world_size=3, window_s=window, stop_check_interval_s=0) as hook:
            for step in range(300):
                hook.save_scalar("loss", float(rank), step=step)
                if step % 50 == 0:
                    time.sleep(0.05)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    job = JobView(out)
    for rank in range(3):
        segments = job.segments(rank)
        assert [s.header.seq for s in segments] == list(range(len(segments)))
        assert [st.step for s in segments for st in s.header.steps] == list(range(300))
        assert job.end_markers()[rank].segments == len(segments)


def test_a_writer_that_cannot_finish_in_time_counts_what_it_did_not_write(tmp_path, monkeypatch):
    from trainguard.hook import segments as segments_module

    gate = threading.Event()
    original = segments_module.SegmentBuilder._prepare

    def slow(self, rec):
        gate.wait(30)
        return original(self, rec)

    monkeypatch.setattr(segments_module.SegmentBuilder, "_prepare", slow)
    hook = trainguard.Hook(tmp_path / "late", flush_timeout_s=0.5, stop_check_interval_s=0)
    for step in range(5):
        hook.save_scalar("loss", 1.0, step=step)
    report = hook.close()
    gate.set()
    assert report.dropped == {"close_timeout": 5} and not report.ok
    assert JobView(tmp_path / "late").end_markers()[0].dropped == {"close_timeout": 5}
