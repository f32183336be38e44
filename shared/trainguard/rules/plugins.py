"""Custom rules: user modules, named explicitly, loaded next to the built-in registry.

A rule module is any importable module that lists its rule classes, written against the
contract of ``trainguard.rules.base``::

    # my_rules/__init__.py
    from my_rules.loss_spike import LossSpike

    RULES = [LossSpike]

The modules to load are named by ``TRAINGUARD_RULE_MODULES`` (comma-separated). Each entry
is a module name (``my_rules``; it must be importable: on Lambda the custom-rules layer puts
it in ``/opt/python``) or, for local use, ``DIR:module`` (``examples/custom_rule:my_rules``),
which puts ``DIR`` first on ``sys.path``. ``trainguard replay``/``rules --rule-module`` add
entries; the CDK stack sets the variable from its ``ruleModules`` setting.

Nothing is scanned: only the classes in ``RULES`` exist. Each is checked (a subclass of
``Rule`` with a PascalCase ``name``, a ``Config`` deriving from ``RuleConfig``, a ``State``
deriving from ``RuleState``, an ``update``, a kind the engine drives, defaults that make a
valid rule, a name no built-in or other module uses). A module that fails to import or
holds an invalid rule is skipped whole and its error kept: built-in rules keep working, and
a job naming one of its rules gets an ``Error`` status whose details carry that error.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.rules.base import AnyRule, BaseRule, Rule, RuleConfig, RuleState
from trainguard.rules.registry import RULES as BUILTIN_RULES

ENV_VAR = "TRAINGUARD_RULE_MODULES"
#: kinds the engine drives for any rule ("model": ``update`` per step; "clock": also
#: ``check(state, now, started=...)`` from the timer). Profiler and cross-job rules are wired
#: specially and cannot be plugged in.
PLUGIN_KINDS = ("model", "clock")
_PASCAL = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: error text kept per module (it ends up in a StatusDetails of at most 1024 characters)
_MAX_ERROR_CHARS = 600

RuleClass = type[Rule[Any, Any]]


class PluginError(ValueError):
    """A rule module that cannot be used (raised only by ``load_plugins(strict=True)``)."""


@dataclass(frozen=True)
class ModuleSpec:
    """One entry of ``TRAINGUARD_RULE_MODULES``: a module name, and a folder to import it from."""

    module: str
    path: str | None = None

    @staticmethod
    def parse(entry: str) -> ModuleSpec:
        entry = entry.strip()
        path, _, module = entry.rpartition(":")
        module = module.strip()
        if not _MODULE.match(module):
            raise PluginError(
                f"rule module {entry!r}: expected a module name (my_rules) or DIR:module "
                "(examples/custom_rule:my_rules)"
            )
        return ModuleSpec(module, path.strip() or None)

    def __str__(self) -> str:
        return f"{self.path}:{self.module}" if self.path else self.module


@dataclass(frozen=True)
class Plugins:
    """The outcome of loading: the merged registry, where each custom rule came from, errors."""

    #: built-in rules first (registry order), then every valid custom rule
    rules: Mapping[str, RuleClass]
    #: custom rule name -> the module that listed it
    origins: Mapping[str, str] = field(default_factory=dict)
    #: module -> why it was skipped
    errors: Mapping[str, str] = field(default_factory=dict)

    @property
    def custom(self) -> dict[str, RuleClass]:
        return {name: self.rules[name] for name in self.origins}

    def unknown_rule_message(self, name: str) -> str:
        """The configuration error for a rule name nobody provides."""
        text = f"unknown rule {name!r}; run 'trainguard rules' for the list"
        if not self.origins and not self.errors:
            text += f" (a custom rule's module must be named in {ENV_VAR})"
        if self.errors:
            failed = "; ".join(f"{module}: {error}" for module, error in self.errors.items())
            text += f". Rule modules that failed to load ({ENV_VAR}): {failed}"
        return text


def module_specs(value: str | None = None) -> tuple[ModuleSpec, ...]:
    """Parse ``TRAINGUARD_RULE_MODULES`` (or ``value``): duplicates dropped, order kept."""
    raw = os.environ.get(ENV_VAR, "") if value is None else value
    specs = [ModuleSpec.parse(entry) for entry in raw.split(",") if entry.strip()]
    return tuple(dict.fromkeys(specs))


def load_plugins(modules: Iterable[str | ModuleSpec] | None = None, *, strict: bool = False) -> Plugins:
    """Import the rule modules once (default: those of ``TRAINGUARD_RULE_MODULES``).

    ``strict`` raises ``PluginError`` naming every module that failed; otherwise failures are
    kept in ``Plugins.errors`` and the other modules (and every built-in rule) still load.
    A malformed ``TRAINGUARD_RULE_MODULES`` is an error of its own, never an exception here.
    """
    try:
        specs = (
            module_specs()
            if modules is None
            else tuple(
                dict.fromkeys(m if isinstance(m, ModuleSpec) else ModuleSpec.parse(m) for m in modules)
            )
        )
    except PluginError as exc:
        if strict:
            raise
        return Plugins(dict(BUILTIN_RULES), errors={ENV_VAR: str(exc)})
    plugins = _load(specs)
    if strict and plugins.errors:
        raise PluginError(
            "\n".join(f"rule module {module!r}: {error}" for module, error in plugins.errors.items())
        )
    return plugins


def rule_class(name: str) -> type[AnyRule] | None:
    """The rule class named ``name``: a built-in, else a custom rule (None: no such rule)."""
    cls = BUILTIN_RULES.get(name)
    if cls is not None:
        return cls
    from trainguard.rules.profiler import PROFILER_RULES  # judged on system batches

    profiler: type[AnyRule] | None = PROFILER_RULES.get(name)
    if profiler is not None:
        return profiler
    return load_plugins().rules.get(name)


def reset() -> None:
    """Forget loaded modules' results (tests); modules stay in ``sys.modules``."""
    with _LOCK:
        _CACHE.clear()


_LOCK = threading.Lock()
_CACHE: dict[tuple[ModuleSpec, ...], Plugins] = {}


def _load(specs: tuple[ModuleSpec, ...]) -> Plugins:
    with _LOCK:  # handlers may parse rules from several threads (local mode)
        cached = _CACHE.get(specs)
        if cached is not None:
            return cached
        rules: dict[str, RuleClass] = dict(BUILTIN_RULES)
        origins: dict[str, str] = {}
        errors: dict[str, str] = {}
        reserved = _reserved_names()
        for spec in specs:
            try:
                classes = _import_rules(spec)
                _check_names(classes, spec.module, reserved, origins)
            except PluginError as exc:
                errors[spec.module] = _short(str(exc))
                continue
            for cls in classes:
                rules[cls.name] = cls
                origins[cls.name] = spec.module
        plugins = Plugins(rules, origins, errors)
        _CACHE[specs] = plugins
        return plugins


def _reserved_names() -> dict[str, str]:
    """Names a custom rule may not take: the model rules and the profiler rules."""
    names = dict.fromkeys(BUILTIN_RULES, "a built-in rule")
    try:
        from trainguard.rules.profiler import PROFILER_RULES
    except Exception:  # pragma: no cover - the profiler package is part of trainguard
        return names
    names.update(dict.fromkeys(PROFILER_RULES, "a built-in profiler rule"))
    return names


def _import_rules(spec: ModuleSpec) -> list[RuleClass]:
    if spec.path is not None:
        folder = str(Path(spec.path).expanduser().resolve())
        if not Path(folder).is_dir():
            raise PluginError(f"no folder {spec.path!r} to import {spec.module} from")
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        module = importlib.import_module(spec.module)
    except Exception as exc:  # ImportError, SyntaxError, anything its top level raises
        raise PluginError(f"import failed: {type(exc).__name__}: {exc}") from exc
    listed = getattr(module, "RULES", None)
    if not isinstance(listed, (list, tuple)) or not listed:
        raise PluginError("the module has no RULES = [YourRule, ...] list of rule classes")
    classes: list[RuleClass] = []
    for item in listed:
        classes.append(validate_rule(item))
    return classes


def validate_rule(cls: Any) -> RuleClass:
    """Check one class against the rule contract; ``PluginError`` says what is wrong."""
    if not isinstance(cls, type) or not issubclass(cls, Rule) or cls is Rule:
        raise PluginError(f"{cls!r} in RULES is not a subclass of trainguard.rules.base.Rule")
    label = cls.__qualname__
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not _PASCAL.match(name):
        raise PluginError(f"{label}.name must be a PascalCase string like 'LossSpike', got {name!r}")
    config = getattr(cls, "Config", None)
    if not isinstance(config, type) or not issubclass(config, RuleConfig):
        raise PluginError(f"{name}.Config must be a subclass of trainguard.rules.base.RuleConfig")
    state = getattr(cls, "State", None)
    if not isinstance(state, type) or not issubclass(state, RuleState):
        raise PluginError(f"{name}.State must be a subclass of trainguard.rules.base.RuleState")
    if cls.update is Rule.update:
        raise PluginError(f"{name} does not implement update(state, step)")
    if cls.kind not in PLUGIN_KINDS:
        raise PluginError(f"{name}.kind must be one of {PLUGIN_KINDS}, got {cls.kind!r}")
    if cls.kind == "clock" and cls.check is BaseRule.check:
        raise PluginError(f"{name} is a clock rule without check(state, now, started=...)")
    if not any(info.is_required() for info in config.model_fields.values()):
        # defaults alone must make a rule whose initial state survives storage
        try:
            rule = cls(config())
            cls.State.model_validate(rule.dump_state(rule.initial_state()))
        except Exception as exc:
            raise PluginError(
                f"{name} with default parameters: {type(exc).__name__}: {exc}".replace("\n", " ")
            ) from exc
    return cls


def _check_names(
    classes: list[RuleClass], module: str, reserved: Mapping[str, str], origins: Mapping[str, str]
) -> None:
    seen: set[str] = set()
    for cls in classes:
        if cls.name in reserved:
            raise PluginError(f"rule name {cls.name!r} clashes with {reserved[cls.name]}; rename it")
        if cls.name in origins:
            raise PluginError(f"rule name {cls.name!r} is already provided by module {origins[cls.name]!r}")
        if cls.name in seen:
            raise PluginError(f"rule name {cls.name!r} is listed twice in RULES")
        seen.add(cls.name)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 1] + "…"
