"""Training-side profiling: the system monitor and the step timer the hook drives."""

from __future__ import annotations

from trainguard.profiling.monitor import SystemMonitor, TimedLoader

__all__ = ["SystemMonitor", "TimedLoader"]
