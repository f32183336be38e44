"""Profiler rules (SageMaker names and parameters), judged over system-monitor batches.

``PROFILER_RULES`` is the explicit registry: a rule missing here does not exist. Every rule
has ``kind == "profiler"``: the engine feeds it system objects, not steps::

    cls = PROFILER_RULES[name]
    rule = cls(cls.Config.model_validate(parameters))      # SageMaker strings are coerced
    state = rule.load_state(stored_dict_or_None)
    batch = parse_system_batch(body)     # system/worker-<rank>/<seq>.json; each worker's in seq order
    state, findings = rule.update(state, batch)             # pure; findings -> IssuesFound
    stored = rule.dump_state(state)                         # JSON-able, a few KB
    findings = rule.finish(state)                           # when the job has ended
    state, findings = rule.check_clock(state, now, job_start)   # CLOCK_RULES only (scheduler)
    rule.notes(state)    # numbers for status/report; "note" says why a rule could not judge
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
from trainguard.rules.profiler.profiler_report import (
    SUB_RULES,
    ProfilerReport,
    RuleResult,
    evaluate_per_worker,
)
from trainguard.rules.profiler.step_outlier import StepOutlier

# ProfilerReport runs every other profiler rule: its SUB_RULES are the one list of them
_ALL: tuple[type[ProfilerRule[Any, Any]], ...] = (*SUB_RULES, ProfilerReport)

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
    "evaluate_per_worker",
]
