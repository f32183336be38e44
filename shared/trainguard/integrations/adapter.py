"""``HookAdapter``: the only place the framework callbacks call ``trainguard.Hook``.

Every call the integrations make into the hook goes through this module, and only through
the hook's public interface (the constructor, ``set_step``, ``set_mode``, ``save_scalar`` and
``save_tensor`` with ``step=``/``mode=``/``collections=``, ``should_stop``, ``stop_signal``,
``close``, and the public ``collections``/``include_regex``/``disabled`` attributes), so a
change of that interface is a change here only.

Why the callbacks give every save an explicit ``step=`` and ``mode=`` instead of
``register_module``: a registered module advances the hook's step on each forward, which is
right for a hand-written loop but not for a trainer, where one optimizer step is several
forwards under gradient accumulation and evaluation forwards run between two training
steps. A trainguard step here is the framework's own global step (the number of optimizer
updates done, as the framework logs it), so "IssuesFound at step 120" points at the
framework's step 120, and evaluation results are recorded at the step after which the
evaluation ran, in EVAL mode.

When to save is decided here, from the hook's save configurations (a collection is due at
a step when its save config says so for that mode, the step being the mode step of an
explicit ``step=``), before any tensor is touched: a step with nothing due costs a few
dictionary look-ups, and the decision does not depend on how ``save_*`` treats explicit
saves.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
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
    """

    def __init__(self, hook: Hook | None, hook_kwargs: Mapping[str, Any], *, framework: str) -> None:
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
        """Save a scalar (a float or a one-element tensor, left on its device) if due."""
        hook = self._hook
        if hook is None or not self.active or not self.due(collection, mode, step):
            return False
        return bool(self._call(hook.save_scalar, name, value, step=step, collections=[collection], mode=mode))

    def tensor(self, name: str, value: Any, *, step: int, mode: ModeKeys, collection: str) -> bool:
        """Save a tensor's statistics (reduced where it lives) if ``collection`` is due.

        The caller checks ``due`` first when finding the tensor costs anything."""
        hook = self._hook
        if hook is None or not self.active or not self.due(collection, mode, step):
            return False
        return bool(self._call(hook.save_tensor, name, value, collections=[collection], step=step, mode=mode))

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


__all__ = ["HookAdapter"]
