"""Step and mode bookkeeping: the global step, the mode, each mode's own step, what is due.

The hook keeps a *global step* (what segments are keyed and ordered by; smdebug's "global
step") and, per mode, a *mode step* (how many steps that mode has seen), which save configs
are checked against (smdebug's semantics). The counter advances on each forward of the
registered top module (the first forward is step 0), on ``advance_step()`` or ``set_step(n)``;
``step=`` on a save call sets it explicitly, and an explicit step is that mode's step too
(a plain loop's own counter: rules and save intervals then count the user's steps).

A step is *sealed* (handed to the writer) when a later step begins or at ``close()``;
nothing can be recorded for a step at or before the newest sealed one (the writer has it,
and a worker's steps must strictly increase).

What is due at (mode, mode step) is decided once per step and cached: the collections whose
save config says so. Gradients are never due in EVAL or PREDICT (no backward pass there;
smdebug skips them too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trainguard.format import layout
from trainguard.hook.config import Collection, CollectionKeys
from trainguard.modes import ModeKeys

#: collections that are never due outside training
_TRAINING_ONLY = frozenset({CollectionKeys.GRADIENTS})
_NO_BACKWARD = frozenset({ModeKeys.EVAL, ModeKeys.PREDICT})


@dataclass(frozen=True)
class StepPlan:
    """What the hook records at one (global step, mode): the public view integrations use.

    A new object for each (step, mode) the hook enters, so ``plan is not previous`` tells an
    integration that a new step (or mode) began.
    """

    step: int
    mode: ModeKeys
    mode_step: int
    #: collections due at this step under their save configs
    due: frozenset[str]

    def wants(self, *collections: str) -> bool:
        """Whether any of ``collections`` is due."""
        return any(c in self.due for c in collections)

    def __bool__(self) -> bool:
        return bool(self.due)


def parse_mode(mode: object) -> ModeKeys:
    """``ModeKeys``, ``"train"``, ``smdebug.modes.TRAIN`` (anything with that name or value)."""
    if isinstance(mode, ModeKeys):
        return mode
    text = str(getattr(mode, "name", None) or getattr(mode, "value", mode)).upper()
    if text.startswith("MODEKEYS."):
        text = text.removeprefix("MODEKEYS.")
    return ModeKeys(text)


def check_step(step: object) -> int:
    if isinstance(step, bool) or not hasattr(step, "__index__"):
        raise ValueError(f"step must be an integer in 0..{layout.MAX_STEP}, got {step!r}")
    value = int(step.__index__())  # type: ignore[attr-defined]
    if not 0 <= value <= layout.MAX_STEP:
        raise ValueError(f"step must be an integer in 0..{layout.MAX_STEP}, got {step!r}")
    return value


class StepBook:
    """The step counter, the mode, mode steps and the due-collections cache.

    ``on_leave`` is called (with the step being left) before the current step changes, so
    the owner seals that step's record. Not thread-safe: the hook calls it under its lock.
    """

    def __init__(self, collections: Mapping[str, Collection], on_leave: Callable[[int], None]) -> None:
        self._collections = collections
        self._on_leave = on_leave
        self.step = 0
        self.mode = ModeKeys.TRAIN
        self.sealed_step: int | None = None
        self._mode_step: dict[ModeKeys, int] = {}
        self._mode_global: dict[ModeKeys, int] = {}
        self._due_cache: dict[tuple[ModeKeys, int], frozenset[str]] = {}
        self._plan: StepPlan | None = None

    @property
    def current(self) -> StepPlan | None:
        """The plan of the (step, mode) entered last, if it is still current."""
        return self._plan

    def collections_changed(self) -> None:
        self._due_cache.clear()
        self._plan = None

    def set_mode(self, mode: ModeKeys) -> None:
        if mode != self.mode:
            self.mode = mode
            self._plan = None

    def move_to(self, step: int) -> None:
        """Make ``step`` current (the current step is left, i.e. sealed, if different)."""
        if step != self.step:
            self._on_leave(self.step)
            self.step = step
            self._plan = None

    def advance(self) -> None:
        self._on_leave(self.step)
        self.step += 1
        self._plan = None

    def enter(self, step: int | None = None, mode: ModeKeys | None = None) -> StepPlan | None:
        """Make (step, mode) current; its plan, or None when that step was already sealed."""
        m = self.mode if mode is None else mode
        if step is not None:
            self.move_to(step)
        plan = self._plan
        if plan is not None and plan.mode is m and plan.step == self.step:
            return plan
        if self.sealed_step is not None and self.step <= self.sealed_step:
            return None
        if self._mode_global.get(m) != self.step:
            self._mode_global[m] = self.step
            # an explicit step= is the mode's step too; otherwise count this mode's steps
            self._mode_step[m] = self.step if step is not None else self._mode_step.get(m, -1) + 1
        mode_step = self._mode_step[m]
        plan = StepPlan(self.step, m, mode_step, self._due(m, mode_step))
        self._plan = plan
        return plan

    def mode_step(self, mode: ModeKeys) -> int | None:
        return self._mode_step.get(mode)

    def _due(self, mode: ModeKeys, mode_step: int) -> frozenset[str]:
        key = (mode, mode_step)
        due = self._due_cache.get(key)
        if due is None:
            if len(self._due_cache) > 64:
                self._due_cache.clear()
            due = frozenset(
                name
                for name, col in self._collections.items()
                if col.save_config is not None
                and col.save_config.should_save_step(mode, mode_step)
                and not (mode in _NO_BACKWARD and name in _TRAINING_ONLY)
            )
            self._due_cache[key] = due
        return due
