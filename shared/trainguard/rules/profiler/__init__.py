"""Profiler rules (SageMaker names and parameters), judged over system-monitor batches.

``PROFILER_RULES`` is the explicit registry: a rule missing here does not exist.
"""

from __future__ import annotations

from typing import Any

from trainguard.rules.profiler.base import ProfilerRule, ProfilerState
from trainguard.rules.profiler.batch_size import BatchSize
from trainguard.rules.profiler.cpu_bottleneck import CPUBottleneck
from trainguard.rules.profiler.dataloader import Dataloader
from trainguard.rules.profiler.gpu_memory_increase import GPUMemoryIncrease
from trainguard.rules.profiler.io_bottleneck import IOBottleneck
from trainguard.rules.profiler.load_balancing import LoadBalancing
from trainguard.rules.profiler.low_gpu_utilization import LowGPUUtilization
from trainguard.rules.profiler.max_initialization_time import MaxInitializationTime
from trainguard.rules.profiler.overall_system_usage import OverallSystemUsage
from trainguard.rules.profiler.profiler_report import ProfilerReport, RuleResult
from trainguard.rules.profiler.step_outlier import StepOutlier

_ALL: tuple[type[ProfilerRule[Any, Any]], ...] = (
    CPUBottleneck,
    IOBottleneck,
    LowGPUUtilization,
    GPUMemoryIncrease,
    BatchSize,
    LoadBalancing,
    MaxInitializationTime,
    StepOutlier,
    Dataloader,
    OverallSystemUsage,
    ProfilerReport,
)

PROFILER_RULES: dict[str, type[ProfilerRule[Any, Any]]] = {cls.name: cls for cls in _ALL}

#: rules the service's clock must drive too: ``rule.check_clock(state, now, job_start)``
CLOCK_RULES = ("MaxInitializationTime", "ProfilerReport")

__all__ = [
    "CLOCK_RULES",
    "PROFILER_RULES",
    "BatchSize",
    "CPUBottleneck",
    "Dataloader",
    "GPUMemoryIncrease",
    "IOBottleneck",
    "LoadBalancing",
    "LowGPUUtilization",
    "MaxInitializationTime",
    "OverallSystemUsage",
    "ProfilerReport",
    "ProfilerRule",
    "ProfilerState",
    "RuleResult",
    "StepOutlier",
]
