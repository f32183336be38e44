"""``HookAdapter``: the only place the framework callbacks call ``trainguard.Hook``.

Every call the integrations make into the hook goes through this module, and only through
the hook's public recording interface (docs/hook.md, "The recording interface"): the
constructor, ``add_framework``, ``set_step``/``set_mode``, ``plan``, ``record_scalar``,
``record_tensor``, ``collections_for``, ``should_stop``, ``stop_signal``, ``close``, and the
public ``collections``/``include_regex``/``disabled`` attributes. A change of that interface
is a change here only.

``record_*``, not ``save_*``: what a callback captures by itself is throttled by the save
configs and gets the statistics the configured rules read (``save_tensor`` is the user's
explicit save: always written, with the full tensor).

Why the callbacks give every record an explicit step and mode instead of
``register_module``: a registered module advances the hook's step on each forward, which is
right for a hand-written loop but not for a trainer, where one optimizer step is several
forwards under gradient accumulation and evaluation forwards run between two training
steps. A trainguard step here is the framework's own global step (the number of optimizer
updates done, as the framework logs it), so "IssuesFound at step 120" points at the
framework's step 120, and evaluation results are recorded at the step after which the
evaluation ran, in EVAL mode.

When to record is decided here, from the hook's save configurations (a collection is due at
a step when its save config says so for that mode), before any tensor is touched: a step
with nothing due costs a few dictionary look-ups.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from trainguard.hook.core import Hook, StopTrainingRequested
from trainguard.modes import ModeKeys

log = logging.getLogger("trainguard.integrations")

T = TypeVar("T")


class HookAdapter:
    """The callbacks' view of one ``Hook``: created lazily, saved to with explicit steps.

    Parameters
    ----------
    hook
        A ``trainguard.Hook`` the caller created (and closes), or None.
    hook_kwargs
        When ``hook`` is None: keyword arguments for ``Hook(...)``, checked now against its
        signature; the hook itself is created at ``open()``, when the framework knows this
        process's rank. ``raise_on_stop`` defaults to False there: a callback stops training
        through the framework, never by raising into it.
    framework
        The framework's name, for messages.
    package
        The framework's distribution (``transformers``, ``lightning``, ``keras``): named with
        its version in the job's manifest.
    produces
        The collections the callback can capture (the hook warns at the first step about a
        configured rule that reads something no integration produces).
    """

    def __init__(
        self,
        hook: Hook | None,
        hook_kwargs: Mapping[str, Any],
        *,
        framework: str,
        package: str | None = None,
        produces: Iterable[str] = (),
    ) -> None:
        if hook is not None and not isinstance(hook, Hook):
            raise TypeError(f"hook must be a trainguard.Hook (or None), got {type(hook).__name__}")
        if hook is not None and hook_kwargs:
            raise TypeError(
                "pass either a trainguard.Hook or the Hook's keyword arguments, not both "
                f"(got a hook and {', '.join(sorted(hook_kwargs))})"
            )
        if hook is None:
            try:
                inspect.signature(Hook).bind_partial(**hook_kwargs)
            except TypeError as exc:
                raise TypeError(f"invalid keyword arguments for trainguard.Hook: {exc}") from None
        self.framework = framework
        self.package = package
        self.produces = tuple(produces)
        self._announced = False
        self.owns_hook = hook is None
        self._hook = hook
        self._kwargs = dict(hook_kwargs)
        self._stop_raised = False
        self._closed = False
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ lifecycle
    @property
    def hook(self) -> Hook | None:
        """The hook, once created (None before ``open()`` for a hook built from keywords)."""
        return self._hook

    @property
    def closed(self) -> bool:
        return self._closed

    def open(self, *, rank: int | None = None, world_size: int | None = None) -> Hook:
        """Create the hook if this adapter owns it (once); ``rank``/``world_size`` from the
        framework unless the keywords name them."""
        if self._hook is None:
            kwargs = dict(self._kwargs)
            kwargs.setdefault("raise_on_stop", False)
            if rank is not None and world_size is not None and "rank" not in kwargs:
                kwargs.setdefault("world_size", world_size)
                kwargs["rank"] = rank
            self._hook = Hook(**kwargs)
        if not self._announced and self.package is not None:
            self._announced = True
            self._hook.add_framework(self.package, _version(self.package), produces=self.produces)
        return self._hook

    @property
    def active(self) -> bool:
        """Whether saving does anything: the hook exists, is open and has not disabled itself."""
        hook = self._hook
        return hook is not None and not self._closed and not hook.disabled

    def close(self) -> None:
        """Close the hook if this adapter created it (a hook passed in is the caller's to close)."""
        if self._closed:
            return
        self._closed = True
        if self.owns_hook and self._hook is not None:
            self._hook.close()

    # ------------------------------------------------------------------ what is saved
    def included(self, collection: str) -> bool:
        """Whether the hook saves ``collection`` at all."""
        hook = self._hook
        return hook is not None and collection in hook.collections

    def due(self, collection: str, mode: ModeKeys, step: int) -> bool:
        """Whether ``collection`` is due at ``step`` in ``mode`` under the hook's save configs."""
        hook = self._hook
        if hook is None:
            return False
        col = hook.collections.get(collection)
        return bool(
            col is not None and col.save_config is not None and col.save_config.should_save_step(mode, step)
        )

    @property
    def include_regex(self) -> list[str]:
        hook = self._hook
        return list(hook.include_regex) if hook is not None else []

    # ------------------------------------------------------------------ recording
    def begin_step(self, step: int, mode: ModeKeys) -> None:
        """Make ``step`` (in ``mode``) the hook's current step: the previous one is sealed, and
        the profiler's step timings follow the framework's steps."""
        hook = self._hook
        if hook is None or not self.active:
            return
        self._call(hook.set_mode, mode)
        self._call(hook.set_step, step)

    def set_mode(self, mode: ModeKeys) -> None:
        hook = self._hook
        if hook is not None and self.active:
            self._call(hook.set_mode, mode)

    def scalar(self, name: str, value: Any, *, step: int, mode: ModeKeys, collection: str) -> bool:
        """Record a scalar (a float or a one-element tensor, left on its device) if due."""
        if not self._enter(collection, step, mode):
            return False
        hook = self._hook
        assert hook is not None
        return bool(self._call(hook.record_scalar, name, value, (collection,)))

    def tensor(self, name: str, value: Any, *, step: int, mode: ModeKeys, collection: str) -> bool:
        """Record a tensor's statistics (reduced where it lives) if ``collection`` is due; the
        full value only where a due collection has ``save_full``.

        The caller checks ``due`` first when finding the tensor costs anything."""
        if not self._enter(collection, step, mode):
            return False
        hook = self._hook
        assert hook is not None
        return bool(self._call(hook.record_tensor, name, value, hook.collections_for(name, (collection,))))

    def _enter(self, collection: str, step: int, mode: ModeKeys) -> bool:
        """Make (step, mode) the hook's current step; whether ``collection`` is due there."""
        hook = self._hook
        if hook is None or not self.active or not self.due(collection, mode, step):
            return False
        plan = self._call(hook.plan, step, mode)
        if plan is None:  # disabled, closed, or a step already written (the hook said so)
            return False
        return collection in plan.due

    # ------------------------------------------------------------------ stopping
    @property
    def should_stop(self) -> bool:
        """True once the service asked this job to stop (a rule with the StopTraining action)."""
        hook = self._hook
        return self._stop_raised or (hook is not None and hook.should_stop)

    @property
    def stop_reason(self) -> str:
        """Which rule asked for the stop and why, for the callbacks' messages."""
        hook = self._hook
        signal = hook.stop_signal if hook is not None else None
        if signal is None:
            return "a StopTraining action of the service"
        return f"rule {signal.rule}: {signal.reason}"

    # ------------------------------------------------------------------ errors
    def warn_once(self, key: str, message: str, *args: Any) -> None:
        """Log ``message`` once per ``key`` (a one-time explanation of what is not recorded)."""
        if key not in self._warned and len(self._warned) < 1000:
            self._warned.add(key)
            log.warning("trainguard (%s): " + message, self.framework, *args)

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """Call the hook. A hook created with ``raise_on_stop=True`` raises the stop request
        once, before saving: note it (the callback stops training through the framework)
        and make the call again, so the value is not lost."""
        try:
            return fn(*args, **kwargs)
        except StopTrainingRequested:
            self._stop_raised = True
            return fn(*args, **kwargs)


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


__all__ = ["HookAdapter"]
