"""SageMaker's rule configurations, in every shape the SageMaker SDK and API write them.

One pure function, :func:`normalize_rules`, turns any of these into the lists trainguard
stores in a job's manifest (``rules``) and the hook configuration, for ``trainguard
replay/local --rules FILE``, ``Hook(rules=...)`` and the stack's ``defaultRules``:

* a list of rule entries (``[{"RuleConfigurationName": ..., "RuleParameters": {...}}, ...]``),
  debugger and profiler rules mixed (a profiler rule is recognised by its ``rule_to_invoke``);
* an object with ``DebugRuleConfigurations`` and/or ``ProfilerRuleConfigurations`` (and
  optionally ``DebugHookConfig``);
* a whole ``CreateTrainingJob`` request, as ``estimator.fit`` sends it (its other keys are
  not trainguard's business and are left alone).

Entries are kept as they are (the SDK's ``RuleEvaluatorImage``, ``action_json`` with its
escaped JSON, ``other_trial_0``, ``scan_interval_us`` ...): what each means here is decided
when the entry is parsed (:func:`trainguard.rules.config.parse_one`), so a manifest written
by any version of the hook is read the same way by the service and by replay.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

DEBUG_KEY = "DebugRuleConfigurations"
PROFILER_KEY = "ProfilerRuleConfigurations"
HOOK_KEY = "DebugHookConfig"
#: SageMaker's limits: 20 entries in each of the two lists (CreateTrainingJob)
MAX_DEBUG_RULES = 20
MAX_PROFILER_RULES = 20
#: a job manifest holds at most this many entries (``Manifest.rules``)
MAX_ENTRIES = 50
#: a rules file is read only up to this size: a real one is a few KB
MAX_FILE_BYTES = 1024 * 1024


class RulesFormatError(ValueError):
    """A rules document that is none of the shapes SageMaker writes."""


class SageMakerRules(NamedTuple):
    """What :func:`normalize_rules` found: ``debug_rules, profiler_rules, hook = normalize_rules(obj)``."""

    debug_rules: list[dict[str, Any]]
    profiler_rules: list[dict[str, Any]]
    #: the request's ``DebugHookConfig`` (None: not given), unchanged
    debug_hook_config: dict[str, Any] | None

    def entries(self) -> list[dict[str, Any]]:
        """Every rule entry, debugger rules first: what a job manifest's ``rules`` holds."""
        return [*self.debug_rules, *self.profiler_rules]


def is_profiler_entry(entry: Any) -> bool:
    """A rule entry that names a profiler rule (judged on system metrics)."""
    from trainguard.rules.profiler import PROFILER_RULES

    if not isinstance(entry, dict):
        return False
    params = entry.get("RuleParameters")
    return isinstance(params, dict) and params.get("rule_to_invoke") in PROFILER_RULES


def normalize_rules(obj: Any) -> SageMakerRules:
    """Debugger rules, profiler rules and the hook configuration of any SageMaker rules document.

    Parameters
    ----------
    obj
        A list of rule entries, an object with ``DebugRuleConfigurations`` and/or
        ``ProfilerRuleConfigurations`` (and ``DebugHookConfig``), or a whole
        ``CreateTrainingJob`` request (already parsed from JSON).

    Returns
    -------
    SageMakerRules
        ``(debug_rules, profiler_rules, debug_hook_config)``; entries are shallow copies.
        Entries are not validated here: a bad entry becomes that rule's ``Error`` status
        when parsed, so it never hides the others.

    Raises
    ------
    RulesFormatError
        ``obj`` is no such document, a list is not a list, or there are more entries than
        a job manifest holds.
    """
    if isinstance(obj, list):
        debug = [_copy(e) for e in obj if not is_profiler_entry(e)]
        profiler = [_copy(e) for e in obj if is_profiler_entry(e)]
        hook: dict[str, Any] | None = None
    elif isinstance(obj, dict):
        known = [k for k in (DEBUG_KEY, PROFILER_KEY, HOOK_KEY) if k in obj]
        if not known:
            if "RuleConfigurationName" in obj or "RuleParameters" in obj:
                raise RulesFormatError(
                    "this is one rule entry: put it in a list, or under DebugRuleConfigurations"
                )
            shown = ", ".join(sorted(str(k) for k in obj)[:8]) or "none"
            raise RulesFormatError(
                f"no {DEBUG_KEY}, {PROFILER_KEY} or {HOOK_KEY} in this object (keys: {shown}); "
                "expected a list of rule configurations, an object with those keys, or a "
                "CreateTrainingJob request"
            )
        debug = [_copy(e) for e in _list(obj, DEBUG_KEY)]
        profiler = [_copy(e) for e in _list(obj, PROFILER_KEY)]
        raw_hook = obj.get(HOOK_KEY)
        if raw_hook is not None and not isinstance(raw_hook, dict):
            raise RulesFormatError(f"{HOOK_KEY} must be an object, got {type(raw_hook).__name__}")
        hook = dict(raw_hook) if raw_hook is not None else None
    else:
        raise RulesFormatError(
            f"expected a list of rule configurations or an object, got {type(obj).__name__}"
        )
    total = len(debug) + len(profiler)
    if total > MAX_ENTRIES:
        raise RulesFormatError(
            f"{total} rule configurations; a job takes at most {MAX_DEBUG_RULES} debugger and "
            f"{MAX_PROFILER_RULES} profiler rules (SageMaker's limits), {MAX_ENTRIES} entries in all"
        )
    return SageMakerRules(debug, profiler, hook)


def load_rules_file(path: str | os.PathLike[str]) -> SageMakerRules:
    """Read and normalise a rules file (any shape :func:`normalize_rules` takes).

    Raises ``RulesFormatError`` (naming the file) for an unreadable, oversized or
    malformed file.
    """
    where = os.fspath(path)
    try:
        with Path(where).open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise RulesFormatError(f"{where}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise RulesFormatError(f"{where}: larger than {MAX_FILE_BYTES} bytes; not a rules file")
    return loads_rules(raw, where)


def loads_rules(raw: str | bytes, where: str = "rules") -> SageMakerRules:
    """Parse and normalise a JSON rules document (``where`` names it in errors)."""
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RulesFormatError(f"{where}: not JSON ({str(exc)[:200]})") from None
    try:
        return normalize_rules(doc)
    except RulesFormatError as exc:
        raise RulesFormatError(f"{where}: {exc}") from None


def _list(obj: dict[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise RulesFormatError(f"{key} must be a list, got {type(value).__name__}")
    return value


def _copy(entry: Any) -> Any:
    return dict(entry) if isinstance(entry, dict) else entry
