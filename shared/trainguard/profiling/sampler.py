"""Host metric readers: Linux ``/proc`` first, psutil as a fallback, NVML for GPUs.

A reader keeps the previous counters and turns them into percentages and rates at each
``sample(t)``; the first call only primes the counters. Nothing here raises for a missing
source: a metric that cannot be read is reported as 0 (host counters) or ``None`` (GPUs,
where "absent" must not read as "idle").
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Any

from trainguard.format.system import MAX_CORES, MAX_GPUS, GpuSample, SystemSample

log = logging.getLogger(__name__)

_PROC = "/proc"
_SKIP_DISK_PREFIXES = ("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd")


@dataclass
class _Cpu:
    busy: int
    total: int
    iowait: int


@dataclass
class _Counters:
    t: float
    total: _Cpu
    cores: list[_Cpu]
    disk_read: int
    disk_write: int
    net_rx: int
    net_tx: int


def _pct(part: float, whole: float) -> float:
    if whole <= 0:
        return 0.0
    return min(100.0, max(0.0, 100.0 * part / whole))


def _rate(now: int, before: int, dt: float) -> float:
    if dt <= 0 or now < before:  # counter reset or wrapped: skip one interval
        return 0.0
    return (now - before) / dt


def _parse_cpu(fields: list[str]) -> _Cpu:
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    values = [int(v) for v in fields[:8]]
    values += [0] * (8 - len(values))
    idle, iowait = values[3], values[4]
    total = sum(values)
    return _Cpu(busy=total - idle - iowait, total=total, iowait=iowait)


class ProcReader:
    """Reads ``/proc/stat``, ``/proc/meminfo``, ``/proc/diskstats`` and ``/proc/net/dev``."""

    def __init__(self, proc: str = _PROC) -> None:
        self.proc = proc
        self._prev: _Counters | None = None
        self._disks = self._physical_disks()

    @staticmethod
    def available(proc: str = _PROC) -> bool:
        return os.path.exists(os.path.join(proc, "stat")) and os.path.exists(os.path.join(proc, "meminfo"))

    def _physical_disks(self) -> set[str] | None:
        try:
            names = os.listdir("/sys/block")
        except OSError:
            return None
        return {n for n in names if not n.startswith(_SKIP_DISK_PREFIXES)}

    def _read(self, name: str) -> str:
        with open(os.path.join(self.proc, name), encoding="ascii", errors="replace") as fh:
            return fh.read()

    def _counters(self, t: float) -> _Counters:
        total = _Cpu(0, 0, 0)
        cores: list[_Cpu] = []
        for line in self._read("stat").splitlines():
            if not line.startswith("cpu"):
                break  # the cpu lines come first
            parts = line.split()
            if parts[0] == "cpu":
                total = _parse_cpu(parts[1:])
            elif len(cores) < MAX_CORES:
                cores.append(_parse_cpu(parts[1:]))
        read = write = 0
        try:
            for line in self._read("diskstats").splitlines():
                parts = line.split()
                if len(parts) < 10:
                    continue
                name = parts[2]
                if self._disks is not None:
                    if name not in self._disks:
                        continue
                elif name.startswith(_SKIP_DISK_PREFIXES) or name[-1:].isdigit():
                    continue
                read += int(parts[5]) * 512
                write += int(parts[9]) * 512
        except OSError:
            pass
        rx = tx = 0
        try:
            for line in self._read("net/dev").splitlines()[2:]:
                iface, _, rest = line.partition(":")
                if iface.strip() == "lo":
                    continue
                parts = rest.split()
                if len(parts) >= 9:
                    rx += int(parts[0])
                    tx += int(parts[8])
        except OSError:
            pass
        return _Counters(t, total, cores, read, write, rx, tx)

    def _memory(self) -> float:
        info: dict[str, int] = {}
        for line in self._read("meminfo").splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable", "MemFree", "Buffers", "Cached"):
                info[key] = int(rest.split()[0])
        total = info.get("MemTotal", 0)
        available = info.get("MemAvailable")
        if available is None:
            available = info.get("MemFree", 0) + info.get("Buffers", 0) + info.get("Cached", 0)
        return _pct(total - available, total)

    def prime(self, t: float) -> None:
        self._prev = self._counters(t)

    def sample(self, t: float, gpus: list[GpuSample] | None) -> SystemSample | None:
        now = self._counters(t)
        prev, self._prev = self._prev, now
        if prev is None:
            return None
        dt = now.t - prev.t
        cores = [
            _pct(c.busy - p.busy, c.total - p.total) for c, p in zip(now.cores, prev.cores, strict=False)
        ]
        dtotal = now.total.total - prev.total.total
        return SystemSample(
            t=t,
            cpu_percent=[round(v, 2) for v in cores],
            cpu_total=round(_pct(now.total.busy - prev.total.busy, dtotal), 2),
            iowait_percent=round(_pct(now.total.iowait - prev.total.iowait, dtotal), 2),
            mem_used_percent=round(self._memory(), 2),
            disk_read_bytes_s=_rate(now.disk_read, prev.disk_read, dt),
            disk_write_bytes_s=_rate(now.disk_write, prev.disk_write, dt),
            net_rx_bytes_s=_rate(now.net_rx, prev.net_rx, dt),
            net_tx_bytes_s=_rate(now.net_tx, prev.net_tx, dt),
            gpus=gpus,
        )


class PsutilReader:
    """The same metrics through psutil (macOS, or a container without ``/proc``)."""

    def __init__(self) -> None:
        import psutil

        self._psutil: Any = psutil
        self._prev: tuple[float, int, int, int, int] | None = None

    @staticmethod
    def available() -> bool:
        try:
            import psutil  # noqa: F401
        except ImportError:
            return False
        return True

    def _io(self, t: float) -> tuple[float, int, int, int, int]:
        ps = self._psutil
        disk = ps.disk_io_counters()
        net = ps.net_io_counters()
        return (
            t,
            int(getattr(disk, "read_bytes", 0) or 0),
            int(getattr(disk, "write_bytes", 0) or 0),
            int(getattr(net, "bytes_recv", 0) or 0),
            int(getattr(net, "bytes_sent", 0) or 0),
        )

    def prime(self, t: float) -> None:
        self._psutil.cpu_percent(percpu=True)
        self._psutil.cpu_times_percent()
        self._prev = self._io(t)

    def sample(self, t: float, gpus: list[GpuSample] | None) -> SystemSample | None:
        ps = self._psutil
        cores = [min(100.0, max(0.0, float(v))) for v in ps.cpu_percent(percpu=True)][:MAX_CORES]
        times = ps.cpu_times_percent()
        iowait = float(getattr(times, "iowait", 0.0))
        idle = float(getattr(times, "idle", 0.0))
        now = self._io(t)
        prev, self._prev = self._prev, now
        if prev is None:
            return None
        dt = now[0] - prev[0]
        return SystemSample(
            t=t,
            cpu_percent=[round(v, 2) for v in cores],
            cpu_total=round(min(100.0, max(0.0, 100.0 - idle - iowait)), 2),
            iowait_percent=round(min(100.0, max(0.0, iowait)), 2),
            mem_used_percent=round(min(100.0, max(0.0, float(ps.virtual_memory().percent))), 2),
            disk_read_bytes_s=_rate(now[1], prev[1], dt),
            disk_write_bytes_s=_rate(now[2], prev[2], dt),
            net_rx_bytes_s=_rate(now[3], prev[3], dt),
            net_tx_bytes_s=_rate(now[4], prev[4], dt),
            gpus=gpus,
        )


class NvmlReader:
    """GPU utilisation and memory through NVML (``pynvml`` from nvidia-ml-py).

    ``open()`` returns None when NVML is not importable, fails to initialise or sees no GPU:
    the samples then carry ``gpus=None``. NVML sees every GPU of the host, whatever
    ``CUDA_VISIBLE_DEVICES`` says.
    """

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self._nvml = nvml
        self._handles = handles

    @classmethod
    def open(cls) -> NvmlReader | None:
        try:
            import pynvml
        except Exception:  # ImportError, or a broken install
            return None
        try:
            pynvml.nvmlInit()
            count = int(pynvml.nvmlDeviceGetCount())
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(min(count, MAX_GPUS))]
        except Exception as exc:
            log.info("trainguard: NVML unavailable (%s); GPU metrics absent", exc)
            return None
        if not handles:
            return None
        return cls(pynvml, handles)

    def read(self) -> list[GpuSample] | None:
        out: list[GpuSample] = []
        for index, handle in enumerate(self._handles):
            util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            total = int(mem.total) or 1
            out.append(
                GpuSample(
                    index=index,
                    util_percent=float(min(100, max(0, util.gpu))),
                    mem_used_percent=round(_pct(int(mem.used), total), 2),
                    mem_used_bytes=int(mem.used),
                )
            )
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):  # shutting down; nothing to report
            self._nvml.nvmlShutdown()
