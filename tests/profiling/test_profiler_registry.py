"""Guard tests: every profiler rule module is registered, golden-tested and well formed."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import trainguard.rules.profiler as profiler_pkg
from trainguard.rules.base import RuleConfig
from trainguard.rules.profiler import PROFILER_RULES, ProfilerRule, ProfilerState

TESTS = Path(__file__).parent
SAGEMAKER_PROFILER_RULES = {
    "CPUBottleneck",
    "IOBottleneck",
    "LowGPUUtilization",
    "GPUMemoryIncrease",
    "BatchSize",
    "LoadBalancing",
    "MaxInitializationTime",
    "StepOutlier",
    "Dataloader",
    "OverallSystemUsage",
    "ProfilerReport",
}


def test_registry_has_exactly_sagemakers_profiler_rules() -> None:
    assert set(PROFILER_RULES) == SAGEMAKER_PROFILER_RULES


def test_every_rule_module_is_registered_and_tested() -> None:
    registered = set(PROFILER_RULES.values())
    for info in pkgutil.iter_modules(profiler_pkg.__path__):
        module = importlib.import_module(f"trainguard.rules.profiler.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(cls, ProfilerRule)
                and cls is not ProfilerRule
                and cls.__module__ == module.__name__
            ):
                assert cls in registered, f"{cls.__name__} is not in PROFILER_RULES"
                path = TESTS / f"test_{info.name}.py"
                assert path.exists() and cls.name in path.read_text(), (
                    f"{cls.name}: no golden test {path.name}"
                )


def test_every_rule_is_well_formed() -> None:
    for name, cls in PROFILER_RULES.items():
        assert cls.name == name and cls.kind == "profiler"
        assert issubclass(cls.Config, RuleConfig) and issubclass(cls.State, ProfilerState)
        assert cls.summary and cls.advice and cls.__doc__
        module_doc = inspect.getmodule(cls).__doc__  # what it reads, when it fires, choices
        assert module_doc and len(module_doc) > 300, name
        rule = cls(cls.Config())
        state = rule.initial_state()
        assert rule.load_state(rule.dump_state(state)) == state
        assert rule.finish(state) == []
