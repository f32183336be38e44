"""What the three callbacks share: the guard that keeps training alive, metric helpers.

No framework is imported here.
"""

from __future__ import annotations

import functools
import logging
import numbers
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

log = logging.getLogger("trainguard.integrations")

P = ParamSpec("P")
R = TypeVar("R")


class Guarded:
    """A callback that never breaks training: an internal error is logged once, with its
    traceback, and the callback switches itself off (``disabled``); training continues."""

    framework = "framework"

    def __init__(self) -> None:
        self.disabled = False

    def _disable(self, exc: BaseException, where: str) -> None:
        if self.disabled:
            return
        self.disabled = True
        log.error(
            "trainguard: internal error in the %s callback (%s); it switches itself off and training "
            "continues without it",
            self.framework,
            where,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        try:
            self._on_disabled()
        except Exception as cleanup:
            log.error("trainguard: could not clean up the %s callback: %s", self.framework, cleanup)

    def _on_disabled(self) -> None:
        """Remove what the callback attached (module hooks); the hook is closed if owned."""


def guarded(fn: Callable[P, R | None]) -> Callable[P, R | None]:
    """Run a callback event; an exception disables the callback instead of reaching the trainer."""

    @functools.wraps(fn)
    def inner(*args: P.args, **kwargs: P.kwargs) -> R | None:
        self = args[0]
        assert isinstance(self, Guarded)
        if self.disabled:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            self._disable(exc, fn.__name__)
            return None

    return inner


def is_loss_name(name: str) -> bool:
    """A metric named like a loss (``loss``, ``eval_loss``, ``val/Loss``)."""
    return "loss" in name.lower()


def metric_value(value: Any) -> Any:
    """A number the hook can save (a float, or a one-element tensor left where it is), else None.

    Strings, lists and many-element tensors in a framework's logs are skipped: they are not
    scalar metrics.
    """
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    numel = getattr(value, "numel", None)
    if callable(numel) and hasattr(value, "detach"):  # torch
        return value.detach().clone() if numel() == 1 else None
    size = getattr(value, "size", None)
    if isinstance(size, int) and size == 1 and hasattr(value, "dtype"):  # numpy, JAX, TF
        try:
            return float(value.reshape(()).item() if hasattr(value, "reshape") else value)
        except (TypeError, ValueError):
            return None
    return None
