"""Which statistics each tensor gets: what the configured rules read, plus what the user asked for.

Every rule declares its inputs (``Rule.reads()`` -> ``RuleInput``: collections, name regexes,
``TensorStats`` fields, scalar or not, modes). For a tensor named ``name`` in collections
``cols`` recorded in ``mode``, an input applies when its modes are empty or include ``mode``,
it is not a scalar-only input, and either it names none of collections and regexes (it reads
whatever is saved, as ExplodingTensor does by default), or ``cols`` meets its collections, or
``name`` matches one of its regexes (``re.match``, as the rules select). The tensor's fields
are the union of the applicable inputs' ``statistics`` and the user's part:

* ``Hook(statistics="all")``: every field, and every optional reduction its collections
  configure;
* ``Collection.statistics`` when set (``("all",)``: everything);
* else, for a collection the user included explicitly (``include_collections``,
  ``collections=``, ``include_regex``), the standard set (``STANDARD_STATISTICS``) and the
  optional reductions the collection configures; for a collection on only by default or
  because a rule reads it: nothing beyond what the rules read;
* an explicit ``save_tensor`` is always an explicit ask: the standard set and more.

A tensor for which nothing at all is wanted is not reduced (and not recorded, unless its
full value is stored). Collections a rule reads are turned on by the hook
(``required_collections``); an input naming only regexes makes its tensors join ``default``
(``extra_regexes``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.hook.config import STANDARD_STATISTICS, Collection, CollectionKeys
from trainguard.hook.stats import StatSpec

log = logging.getLogger("trainguard.hook")

#: in a declaration's statistics: the standard set and the optional reductions each
#: collection configures (what a rule that does not declare its reads is given)
CONFIGURED = "*"
#: what a rule that does not declare its reads is given: the collections every earlier
#: trainguard hook saved by default, with their configured statistics
UNDECLARED_COLLECTIONS = CollectionKeys.DEFAULT_INCLUDED
#: rule kinds that read the job's tensors and scalars (profiler rules read system metrics,
#: clock rules the time)
_DATA_KINDS = ("model", "cross-job", "report")

#: optional reductions a collection can configure -> the TensorStats field each fills
_OPTIONAL_BY_REDUCTION = {
    "percentiles": ("percentiles",),
    "histogram": ("histogram",),
    "unit_active": ("unit_active",),
    "unit_in_band": ("unit_in_band", "band"),
    "values": ("values",),
    "value_counts": ("value_counts",),
    "update_l2": ("update_l2",),
}
_EVERYTHING = frozenset(STANDARD_STATISTICS) | frozenset(
    f for fs in _OPTIONAL_BY_REDUCTION.values() for f in fs
)


@dataclass(frozen=True)
class ReadDeclaration:
    """One input of one configured rule, compiled."""

    rule: str
    what: str
    collections: frozenset[str]
    regex: tuple[re.Pattern[str], ...]
    statistics: frozenset[str]
    scalars: bool
    modes: frozenset[str]
    required: bool

    @staticmethod
    def of(rule: str, item: Any) -> ReadDeclaration:
        return ReadDeclaration(
            rule=rule,
            what=str(getattr(item, "what", "") or rule),
            collections=frozenset(getattr(item, "collections", ()) or ()),
            regex=tuple(re.compile(r) for r in getattr(item, "regex", ()) or ()),
            statistics=frozenset(getattr(item, "statistics", ()) or ()),
            scalars=bool(getattr(item, "scalars", False)),
            modes=frozenset(getattr(item, "modes", ()) or ()),
            required=bool(getattr(item, "required", True)),
        )

    def applies(self, name: str, collections: Iterable[str], mode: str) -> bool:
        if self.scalars or (self.modes and mode not in self.modes):
            return False
        if not self.collections and not self.regex:
            return True
        return bool(self.collections.intersection(collections)) or any(p.match(name) for p in self.regex)


@dataclass(frozen=True)
class TensorChoice:
    """What to compute for one tensor."""

    spec: StatSpec
    #: keep a copy between saves for ``update_l2`` (WeightUpdateRatio)
    update_norm: bool

    @property
    def empty(self) -> bool:
        return self.spec.is_empty() and not self.update_norm


class StatisticsPlan:
    """Per-tensor statistics from the configured rules' declarations and the user's asks."""

    def __init__(
        self,
        reads: Sequence[ReadDeclaration],
        *,
        explicit: Iterable[str] = (),
        everything: bool = False,
    ) -> None:
        self.reads = tuple(reads)
        self.explicit = frozenset(explicit)
        self.everything = everything
        self._cache: dict[tuple[str, tuple[str, ...], str, bool], TensorChoice] = {}

    def asked_for(self, collection: str) -> None:
        """The user named ``collection`` (``add_collection``): it gets the standard set too."""
        self.explicit = self.explicit | {collection}
        self._cache.clear()

    def required_collections(self) -> set[str]:
        """Collections some configured rule reads (the hook turns them on).

        A required input that reads "whatever tensors are saved" (no collections, no regexes:
        SimilarAcrossRuns at its defaults) turns on the former default tensor collections, so
        that something is saved for it to read.
        """
        out = {c for r in self.reads for c in r.collections}
        for r in self.reads:
            if r.required and not r.scalars and not r.collections and not r.regex:
                out.update(c for c in UNDECLARED_COLLECTIONS if c not in CollectionKeys.SCALAR_COLLECTIONS)
        return out

    def extra_regexes(self) -> list[str]:
        """Regexes of inputs that name no collection: their tensors are recorded into ``default``."""
        out: list[str] = []
        for r in self.reads:
            if r.collections or r.scalars:
                continue
            out.extend(p.pattern for p in r.regex if p.pattern not in out)
        return out

    def choose(
        self, name: str, collections: Sequence[Collection], mode: str, *, explicit_save: bool = False
    ) -> TensorChoice:
        key = (name, tuple(c.name for c in collections), mode, explicit_save)
        choice = self._cache.get(key)
        if choice is None:
            if len(self._cache) > 50_000:
                self._cache.clear()
            choice = self._choose(name, collections, mode, explicit_save)
            self._cache[key] = choice
        return choice

    def _choose(
        self, name: str, collections: Sequence[Collection], mode: str, explicit_save: bool
    ) -> TensorChoice:
        col_names = [c.name for c in collections]
        fields: set[str] = set()
        configured = False
        for read in self.reads:
            if read.applies(name, col_names, mode):
                fields |= read.statistics - {CONFIGURED}
                configured = configured or CONFIGURED in read.statistics
        for col in collections:
            fields |= self._user_fields(col, explicit_save or configured)
        if self.everything:
            fields |= _EVERYTHING
        return TensorChoice(StatSpec.of(collections, fields), "update_l2" in fields)

    def _user_fields(self, col: Collection, explicit_save: bool) -> set[str]:
        if col.statistics is not None:
            return set(_EVERYTHING) if col.statistics == ("all",) else set(col.statistics)
        if self.everything or explicit_save or col.name in self.explicit:
            fields = set(STANDARD_STATISTICS)
            for reduction in col.reductions():
                fields.update(_OPTIONAL_BY_REDUCTION.get(reduction, ()))
            return fields
        return set()


def undeclared(rule: str) -> ReadDeclaration:
    """What a rule gets when the hook cannot tell what it reads: the former defaults."""
    return ReadDeclaration(
        rule=rule,
        what="the default collections (the rule does not declare what it reads)",
        collections=frozenset(UNDECLARED_COLLECTIONS),
        regex=(),
        statistics=frozenset({CONFIGURED}),
        scalars=False,
        modes=frozenset(),
        required=False,
    )


def declarations(configured: Iterable[Any]) -> tuple[list[ReadDeclaration], list[str]]:
    """Compile the reads of parsed rule configurations; (declarations, problems to warn about).

    A rule that could not be configured here (unknown name, bad parameters, a custom rule
    whose module is not importable in the training job), or whose class does not declare
    ``reads()``, gets ``undeclared``: the collections and statistics every earlier hook saved.
    A problem is returned so the hook can say so.
    """
    from trainguard.rules.base import Rule

    reads: list[ReadDeclaration] = []
    problems: list[str] = []
    for item in configured:
        rule = getattr(item, "rule", None)
        name = str(getattr(item, "configuration_name", "?"))
        label = f"{name} ({getattr(item, 'rule_name', '?')})"
        if rule is None:
            problems.append(f"rule {label}: {getattr(item, 'error', None) or 'not available here'}")
            reads.append(undeclared(name))
            continue
        if getattr(rule, "kind", "model") not in _DATA_KINDS:
            continue
        if type(rule).reads is Rule.reads:
            reads.append(undeclared(name))
            continue
        try:
            items = tuple(rule.reads())
        except Exception as exc:  # a custom rule's own code must not break the hook
            problems.append(f"rule {label}: reads() failed: {type(exc).__name__}: {exc}")
            reads.append(undeclared(name))
            continue
        for entry in items:
            try:
                reads.append(ReadDeclaration.of(name, entry))
            except (re.error, TypeError) as exc:
                problems.append(f"rule {label}: an input it declares is invalid: {exc}")
    return reads, problems


def scalar_collections(reads: Iterable[ReadDeclaration]) -> set[str]:
    """Collections whose scalars some rule reads (``losses`` for the loss rules)."""
    return {c for r in reads if r.scalars for c in r.collections}


class FeedCheck:
    """Says plainly when a configured rule cannot get what it reads: at the first step, for
    a collection nothing registered produces; at close, for a required input never saved."""

    def __init__(self, reads: Sequence[ReadDeclaration], problems: Sequence[str]) -> None:
        self.reads = tuple(reads)
        self.problems = tuple(problems)
        self._said: set[str] = set()

    def first_step(self, producers: Mapping[str, set[str]]) -> None:
        for problem in self.problems:
            log.warning(
                "trainguard: %s; the hook cannot tell what it reads and records the defaults", problem
            )
        if not producers:
            return  # a plain loop: explicit saves decide; at_close says what no rule received
        produced = set().union(*producers.values())
        for read in self.reads:
            if not read.required or read.scalars or not read.collections:
                continue  # scalars (losses) are usually saved explicitly: at_close says if none came
            if not read.collections & produced:
                self._said.add(read.rule + ":" + read.what)
                log.warning(
                    "trainguard: rule %s reads %s (collections %s), but nothing registered with this "
                    "hook (%s) produces them: that rule will see nothing unless you save them with "
                    "hook.save_tensor(..., collections=[%r])",
                    read.rule,
                    read.what,
                    ", ".join(sorted(read.collections)),
                    ", ".join(sorted(producers)),
                    sorted(read.collections)[0],
                )

    def at_close(self, received: set[str]) -> None:
        for read in self.reads:
            if read.rule + ":" + read.what in self._said:
                continue  # said at the first step already
            if read.required and read.collections and not read.collections & received:
                log.warning(
                    "trainguard: rule %s reads %s, but this worker saved nothing in %s: the rule "
                    "cannot have checked it",
                    read.rule,
                    read.what,
                    ", ".join(sorted(read.collections)),
                )
