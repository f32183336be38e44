"""The system monitor: samples arrive, intervals are validated, GPUs absent stay absent, flushes
happen on time and on close, and nothing it does can raise into training."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from pathlib import Path

import pytest
from trainguard.format.layout import ObjectKind, parse_relative
from trainguard.format.system import GpuSample, SystemBatch, parse_system_batch
from trainguard.modes import ModeKeys
from trainguard.profiling import SystemMonitor
from trainguard.profiling.sampler import ProcReader, PsutilReader


class Sink:
    def __init__(self) -> None:
        self.items: list[tuple[str, bytes, float]] = []
        self.lock = threading.Lock()

    def __call__(self, key: str, body: bytes) -> None:
        with self.lock:
            self.items.append((key, body, time.monotonic()))

    @property
    def batches(self) -> list[SystemBatch]:
        return [parse_system_batch(body) for _, body, _ in self.items]


def monitor(sink: Sink, **kw) -> SystemMonitor:
    kw.setdefault("interval_s", 0.1)
    kw.setdefault("flush_s", 10.0)
    return SystemMonitor(sink, "mon-job", **kw)


def test_samples_arrive_with_contiguous_keys() -> None:
    sink = Sink()
    m = monitor(sink, flush_s=0.3, gpus=False).start()
    time.sleep(1.0)
    m.close()
    batches = sink.batches
    assert len(batches) >= 2
    for seq, (key, _, _) in enumerate(sink.items):
        ref = parse_relative("mon-job", key)
        assert ref.kind == ObjectKind.SYSTEM and ref.worker == 0 and ref.seq == seq
    samples = [s for b in batches for s in b.samples]
    assert len(samples) >= 6
    assert all(len(s.cpu_percent) == os.cpu_count() for s in samples)
    assert all(0 <= s.cpu_total <= 100 and 0 < s.mem_used_percent <= 100 for s in samples)
    times = [s.t for s in samples]
    assert times == sorted(times)
    assert batches[0].init is not None and batches[0].interval_s == 0.1
    assert m.stats()["samples"] == len(samples)


@pytest.mark.parametrize("bad", [0.05, 0.0, -1, 60.5, 1e9, "0.5", True, float("nan")])
def test_interval_outside_100ms_to_60s_is_refused(bad) -> None:
    with pytest.raises(ValueError, match="interval_s"):
        SystemMonitor(Sink(), "mon-job", interval_s=bad)


@pytest.mark.parametrize("good", [0.1, 0.5, 60])
def test_interval_bounds_are_allowed(good) -> None:
    assert SystemMonitor(Sink(), "mon-job", interval_s=good).interval_s == float(good)


@pytest.mark.parametrize(
    "kw", [{"flush_s": 0}, {"flush_s": 4000}, {"worker": -1}, {"worker": 2, "world_size": 2}]
)
def test_other_arguments_are_validated(kw) -> None:
    with pytest.raises(ValueError):
        SystemMonitor(Sink(), "mon-job", **kw)
    with pytest.raises(ValueError):
        SystemMonitor(Sink(), "bad/job")


def test_gpus_absent_are_recorded_as_absent_not_zero() -> None:
    sink = Sink()
    m = monitor(sink, gpus=False).start()
    time.sleep(0.35)
    m.close()
    samples = [s for b in sink.batches for s in b.samples]
    assert samples and all(s.gpus is None for s in samples)
    assert '"gpus":null' in sink.items[0][1].decode()


def test_default_gpu_probe_without_nvml_is_absent() -> None:
    pytest.importorskip
    try:
        import pynvml  # noqa: F401

        pytest.skip("pynvml is installed: the default probe would see real GPUs")
    except ImportError:
        pass
    sink = Sink()
    m = monitor(sink).start()
    time.sleep(0.35)
    m.close()
    assert m.stats()["gpus"] is False
    assert all(s.gpus is None for b in sink.batches for s in b.samples)


class FakeGpus:
    def __init__(self) -> None:
        self.closed = False

    def read(self) -> list[GpuSample]:
        return [
            GpuSample(index=i, util_percent=50.0 + i, mem_used_percent=10.0, mem_used_bytes=10**9)
            for i in (0, 1)
        ]

    def close(self) -> None:
        self.closed = True


def test_gpu_reader_values_are_recorded() -> None:
    sink, gpus = Sink(), FakeGpus()
    m = monitor(sink, gpus=gpus).start()
    time.sleep(0.35)
    m.close()
    samples = [s for b in sink.batches for s in b.samples]
    assert samples and all(
        s.gpus is not None and [g.util_percent for g in s.gpus] == [50.0, 51.0] for s in samples
    )
    assert gpus.closed


def test_flush_cadence_follows_flush_s() -> None:
    sink = Sink()
    m = monitor(sink, flush_s=0.25, gpus=False).start()
    time.sleep(1.4)
    m.close()
    stamps = [t for _, _, t in sink.items]
    assert 4 <= len(stamps) <= 8
    gaps = [b - a for a, b in itertools.pairwise(stamps[:-1])]  # the last one is close()
    assert all(0.15 <= g <= 0.5 for g in gaps), gaps
    batches = sink.batches
    for a, b in itertools.pairwise(batches):
        assert b.start_time == pytest.approx(a.end_time)  # batches tile the timeline


def test_close_flushes_pending_steps_and_samples() -> None:
    sink = Sink()
    m = monitor(sink, flush_s=60.0, gpus=False).start()
    m.mark_initialized()
    for step in range(5):
        m.step_started(ModeKeys.TRAIN, step)
        m.step_ended(ModeKeys.TRAIN, step)
    time.sleep(0.25)
    assert sink.items == []
    m.close()
    m.close()  # idempotent
    (batch,) = sink.batches
    assert [e.step for e in batch.steps] == [0, 1, 2, 3, 4] and batch.samples
    assert batch.init is not None and batch.init.initialized is not None
    assert batch.init.first_step_start is not None and batch.init.first_step_start >= batch.init.hook_start


def test_close_without_start_still_emits_steps() -> None:
    sink = Sink()
    m = monitor(sink)
    m.step_started("EVAL", 3)
    m.step_ended("EVAL", 3)
    m.close()
    (batch,) = sink.batches
    assert batch.steps[0].mode == "EVAL" and batch.samples == []


def test_timed_loader_measures_data_wait_and_keeps_the_loader_interface() -> None:
    class SlowLoader:
        num_workers = 3
        dataset = "the dataset"

        def __len__(self) -> int:
            return 4

        def __iter__(self):
            for i in range(4):
                time.sleep(0.02)
                yield i

    sink = Sink()
    m = monitor(sink, sample_system=False).start()
    loader = m.timed_loader(SlowLoader())
    assert len(loader) == 4 and loader.dataset == "the dataset"
    seen = []
    for step, item in enumerate(loader):
        m.step_started("TRAIN", step)
        seen.append(item)
        m.step_ended("TRAIN", step)
    m.close()
    assert seen == [0, 1, 2, 3]
    (batch,) = sink.batches
    assert batch.samples == []  # sample_system=False: timings only
    assert all(0.015 <= e.data_wait_s < 0.5 for e in batch.steps)
    assert batch.dataloader is not None and batch.dataloader.num_workers == 3


def test_bad_modes_and_unmatched_ends_are_dropped_not_raised() -> None:
    sink = Sink()
    m = monitor(sink, sample_system=False)
    m.step_ended("TRAIN", 1)  # never started: ignored
    m.step_started("WARMUP", 0)
    m.step_ended("WARMUP", 0)
    m.step_started("TRAIN", 2)
    m.step_ended("TRAIN", 2)
    m.close()
    (batch,) = sink.batches
    assert [e.step for e in batch.steps] == [2] and batch.dropped_events == 1


def test_emit_errors_disable_the_monitor_without_raising(caplog) -> None:
    calls = []

    def failing(key: str, body: bytes) -> None:
        calls.append(key)
        raise OSError("disk full")

    caplog.set_level(logging.WARNING)
    m = SystemMonitor(failing, "mon-job", interval_s=0.1, flush_s=0.2, gpus=False).start()
    time.sleep(0.6)
    for step in range(3):  # the training loop goes on
        m.step_started("TRAIN", step)
        m.step_ended("TRAIN", step)
        m.data_wait(0.1)
    m.close()
    assert calls == [calls[0]] and not m.enabled
    assert sum("system monitor disabled" in r.message for r in caplog.records) == 1


def test_reader_errors_disable_the_monitor_without_raising() -> None:
    class Broken:
        def prime(self, t: float) -> None:
            raise RuntimeError("no /proc")

        def sample(self, t, gpus):  # pragma: no cover
            raise AssertionError

    m = monitor(Sink(), reader=Broken(), gpus=False).start()
    time.sleep(0.2)
    m.step_started("TRAIN", 0)
    m.close()
    assert not m.enabled


def test_hot_path_costs_microseconds() -> None:
    m = monitor(Sink(), sample_system=False)
    n = 20_000
    t0 = time.perf_counter()
    for step in range(n):
        m.step_started("TRAIN", step)
        m.data_wait(0.001)
        m.step_ended("TRAIN", step)
    per_step = (time.perf_counter() - t0) / n
    m.close()
    assert per_step < 20e-6, f"{per_step * 1e6:.1f} µs per step"


def test_events_are_flushed_early_when_many() -> None:
    sink = Sink()
    m = monitor(sink, sample_system=False, flush_s=600).start()
    for step in range(12_000):
        m.step_started("TRAIN", step)
        m.step_ended("TRAIN", step)
    m.close()
    batches = sink.batches
    assert sum(len(b.steps) for b in batches) + sum(b.dropped_events for b in batches) == 12_000
    assert len(batches) >= 2


def _fake_proc(root: Path, busy: int, idle: int, iowait: int, read_sectors: int, rx: int) -> None:
    (root / "net").mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(
        f"cpu  {busy * 2} 0 0 {idle * 2} {iowait * 2} 0 0 0 0 0\n"
        f"cpu0 {busy} 0 0 {idle} {iowait} 0 0 0 0 0\n"
        f"cpu1 {busy} 0 0 {idle} {iowait} 0 0 0 0 0\n"
        "intr 1 2 3\n"
    )
    (root / "meminfo").write_text("MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 250 kB\n")
    (root / "diskstats").write_text(f"   8       0 sda 1 0 {read_sectors} 0 1 0 {read_sectors * 2} 0 0 0 0\n")
    (root / "net" / "dev").write_text(
        "Inter-| Receive | Transmit\n face |bytes packets|bytes\n"
        f"    lo: 999999 1 0 0 0 0 0 0 999999 1 0 0 0 0 0 0\n"
        f"  eth0: {rx} 1 0 0 0 0 0 0 {rx // 2} 1 0 0 0 0 0 0\n"
    )


def test_proc_reader_turns_counters_into_percentages_and_rates(tmp_path: Path) -> None:
    _fake_proc(tmp_path, busy=100, idle=100, iowait=0, read_sectors=0, rx=0)
    reader = ProcReader(str(tmp_path))
    reader._disks = {"sda"}
    reader.prime(10.0)
    # +60 busy, +20 idle, +20 iowait jiffies per core; +2000 sectors read; +5000 bytes received in 2 s
    _fake_proc(tmp_path, busy=160, idle=120, iowait=20, read_sectors=2000, rx=5000)
    s = reader.sample(12.0, None)
    assert s is not None
    assert s.cpu_percent == [60.0, 60.0] and s.cpu_total == 60.0 and s.iowait_percent == 20.0
    assert s.mem_used_percent == 75.0
    assert s.disk_read_bytes_s == 2000 * 512 / 2 and s.disk_write_bytes_s == 4000 * 512 / 2
    assert s.net_rx_bytes_s == 2500.0 and s.net_tx_bytes_s == 1250.0  # lo excluded
    assert s.gpus is None


def test_psutil_reader_works() -> None:
    reader = PsutilReader()
    reader.prime(time.time())
    time.sleep(0.1)
    s = reader.sample(time.time(), None)
    assert s is not None and len(s.cpu_percent) == os.cpu_count()


class _FakeNvml:
    """Stands in for ``pynvml`` (nvidia-ml-py): the calls NvmlReader makes, nothing more."""

    def __init__(self, count: int = 2, fail_init: bool = False) -> None:
        self.count, self.fail_init, self.shutdown = count, fail_init, False

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int):
        return type("U", (), {"gpu": 40 + h, "memory": 5})()

    def nvmlDeviceGetMemoryInfo(self, h: int):
        return type("M", (), {"used": 20 * 2**30, "total": 80 * 2**30, "free": 60 * 2**30})()

    def nvmlShutdown(self) -> None:
        self.shutdown = True


def test_nvml_reader_reads_every_gpu(monkeypatch) -> None:
    import sys

    from trainguard.profiling.sampler import NvmlReader

    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reader = NvmlReader.open()
    assert reader is not None
    gpus = reader.read()
    assert [(g.index, g.util_percent, g.mem_used_percent, g.mem_used_bytes) for g in gpus] == [
        (0, 40.0, 25.0, 20 * 2**30),
        (1, 41.0, 25.0, 20 * 2**30),
    ]
    reader.close()
    assert fake.shutdown


@pytest.mark.parametrize("fake", [_FakeNvml(fail_init=True), _FakeNvml(count=0)])
def test_nvml_without_driver_or_devices_means_absent(monkeypatch, fake) -> None:
    import sys

    from trainguard.profiling.sampler import NvmlReader

    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert NvmlReader.open() is None
    sink = Sink()
    m = monitor(sink).start()
    time.sleep(0.3)
    m.close()
    assert m.stats()["gpus"] is False and all(s.gpus is None for b in sink.batches for s in b.samples)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_never_emits() -> None:
    sink = Sink()
    m = monitor(sink, flush_s=60.0, gpus=False).start()
    m.step_started("TRAIN", 0)
    m.step_ended("TRAIN", 0)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child, like a DataLoader worker: calls must be no-ops
        try:
            m.step_started("TRAIN", 1)
            m.step_ended("TRAIN", 1)
            m.close()
            os.write(write_end, b"ok" if (not m.enabled and not sink.items[1:]) else b"bad")
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    assert os.read(read_end, 8) == b"ok"
    m.close()
    (batch,) = sink.batches  # the parent's batch only, with the parent's step
    assert [e.step for e in batch.steps] == [0]
