"""Guard tests: every rule module is registered, tested, and listed by ``trainguard rules``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import trainguard.rules as rules_pkg
from trainguard.rules._common import TrainingClock
from trainguard.rules.base import Rule, RuleConfig, RuleState
from trainguard.rules.catalog import describe_rules
from trainguard.rules.config import DEFAULT_RULES, parse_rule_configurations
from trainguard.rules.profiler import PROFILER_RULES
from trainguard.rules.registry import RULES

TESTS = Path(__file__).parent
#: rules whose defaults alone cannot fire, so a bare configuration is an Error status
NEED_PARAMETERS: set[str] = set()


def _rule_classes_by_module() -> dict[str, list[type]]:
    found: dict[str, list[type]] = {}
    for info in pkgutil.iter_modules(rules_pkg.__path__):
        module = importlib.import_module(f"trainguard.rules.{info.name}")
        classes = [
            obj
            for _, obj in inspect.getmembers(module, inspect.isclass)
            if issubclass(obj, Rule) and obj is not Rule and obj.__module__ == module.__name__
        ]
        if classes:
            found[info.name] = classes
    return found


def test_every_rule_module_is_registered() -> None:
    by_module = _rule_classes_by_module()
    assert by_module, "no rule modules found"
    registered = set(RULES.values())
    for module, classes in by_module.items():
        for cls in classes:
            assert cls in registered, f"{cls.__name__} in trainguard/rules/{module}.py is not in registry.py"


def test_every_registered_rule_has_a_golden_test_file() -> None:
    for name, cls in RULES.items():
        module = cls.__module__.rsplit(".", 1)[-1]
        path = TESTS / f"test_{module}.py"
        assert path.exists(), f"{name}: missing golden test {path.name}"
        assert name in path.read_text(), f"{path.name} never mentions {name}"


def test_every_rule_is_well_formed() -> None:
    for name, cls in RULES.items():
        assert cls.name == name and name[0].isupper() and "_" not in name
        assert issubclass(cls.Config, RuleConfig) and cls.Config is not RuleConfig
        assert issubclass(cls.State, RuleState)
        assert cls.summary and cls.advice and cls.__doc__, f"{name}: summary, advice and docstring"
        assert cls.kind in ("model", "profiler", "clock", "cross-job", "report")
        # defaults alone make a valid configuration (except declared required parameters)
        required = [f for f, info in cls.Config.model_fields.items() if info.is_required()]
        if not required and name not in NEED_PARAMETERS:
            rule = cls(cls.Config())
            rule.dump_state(rule.initial_state())
        elif name in NEED_PARAMETERS:
            [configured] = parse_rule_configurations(
                [{"RuleConfigurationName": name, "RuleParameters": {"rule_to_invoke": name}}]
            )
            assert configured.error is not None


#: rules whose state holds a container; their state-size test must run LONG (100,000) steps
CONTAINER_STATES = {
    "LossNotDecreasing",
    "LossDivergence",
    "LossConverged",
    "Overfit",
    "OscillatingLoss",
    "Overtraining",
    "UnchangedTensor",
    "WeightUpdateRatio",
    "ClassImbalance",
    "Confusion",
}
#: TrainingClock is two scalars (the clock every window counts on)
SCALARS = (int, float, bool, str, int | None, float | None, str | None, bool | None, TrainingClock)


def test_state_is_scalars_or_a_tested_container() -> None:
    for name, cls in RULES.items():
        containers = [f for f, info in cls.State.model_fields.items() if info.annotation not in SCALARS]
        if containers:
            assert name in CONTAINER_STATES, f"{name}.State has containers {containers}: bound them and test"
        if name in CONTAINER_STATES:
            module = cls.__module__.rsplit(".", 1)[-1]
            assert "LONG" in (TESTS / f"test_{module}.py").read_text(), f"{name}: no LONG state-size test"


def test_every_rule_appears_in_the_catalog() -> None:
    rows = {row["name"]: row for row in describe_rules()}
    assert set(rows) == set(RULES) | set(PROFILER_RULES)
    assert {row["name"] for row in describe_rules(profiler=False)} == set(RULES)
    for name, cls in RULES.items():
        row = rows[name]
        assert row["kind"] == cls.kind and row["summary"] == cls.summary and row["advice"] == cls.advice
        assert list(row["parameters"]) == list(cls.Config.model_fields)
    lnd = rows["LossNotDecreasing"]["parameters"]
    assert lnd["num_steps"] == "None" and lnd["mode"] == "None" and lnd["use_losses_collection"] == "True"
    assert rows["DeadRelu"]["parameters"]["tensor_regex"] == ".*relu_output"
    assert rows["SaturatedActivation"]["parameters"]["tensor_regex"] == ".*tanh_input|.*sigmoid_input"
    assert rows["SimilarAcrossRuns"]["required"] == ["other_trials"]


def test_default_rule_set_parses() -> None:
    configured = parse_rule_configurations(None)
    assert [c.rule_name for c in configured] == list(DEFAULT_RULES)
    assert all(c.error is None and c.rule is not None for c in configured)


def test_unknown_rule_is_an_error() -> None:
    [c] = parse_rule_configurations(
        [{"RuleConfigurationName": "x", "RuleParameters": {"rule_to_invoke": "NoSuchRule"}}]
    )
    assert c.rule is None and c.error is not None and "unknown rule" in c.error
