"""Logging in the functions: every log line through Powertools, trainguard's own loggers included.

A function's handler makes its Powertools ``Logger`` with :func:`function_logger`. The
package's loggers (``trainguard.*``: the engine, the service modules) are plain ``logging``
loggers; without this they would bypass Powertools (plain text, no request id, INFO dropped
by the Lambda runtime's root logger at WARNING). ``function_logger`` gives the
``trainguard`` logger one handler that hands each record to the Powertools logger of the
function that is running, at that logger's level, with its keys (``function_request_id``
from ``inject_lambda_context``, ``service``...).

In Lambda one process runs one function (``AWS_LAMBDA_FUNCTION_NAME`` is set): its logger
takes every record. The local mode runs every function in one process (in threads); it names
the running function with :func:`running`, so each record goes to the right function's
logger. Outside Lambda every record also propagates to the root logger as usual (a record
logged outside any function — the local runtime itself, a CLI, a test — only there).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aws_lambda_powertools import Logger

PACKAGE_LOGGER = "trainguard"
_loggers: dict[str, Logger] = {}
_running: ContextVar[str | None] = ContextVar("trainguard_running_function", default=None)


class _ThroughFunctionLogger(logging.Handler):
    """Forwards a ``trainguard.*`` record to the running function's Powertools handler."""

    def emit(self, record: logging.LogRecord) -> None:
        target = current_logger()
        if target is not None and record.levelno >= target.log_level:
            target.registered_handler.handle(record)


def _in_lambda() -> bool:
    return bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME"))


def current_logger() -> Logger | None:
    """The Powertools logger of the function running in this context (in Lambda: the one)."""
    name = _running.get()
    if name is not None and name in _loggers:
        return _loggers[name]
    if _in_lambda() and len(_loggers) == 1:
        return next(iter(_loggers.values()))
    return None


def function_logger(function_id: str) -> Logger:
    """The Powertools logger of one function of the wiring.

    ``service`` is the function's POWERTOOLS_SERVICE_NAME (``FunctionSpec.service_name``); the
    level comes from POWERTOOLS_LOG_LEVEL (the stack and the local runtime set it).
    """
    from aws_lambda_powertools import Logger

    from trainguard.wiring import WIRING

    service_name = WIRING.function(function_id).service_name
    logger = Logger(service=service_name)
    logger.append_keys(name="%(name)s")  # which trainguard logger wrote the line
    _loggers[service_name] = logger
    package = logging.getLogger(PACKAGE_LOGGER)
    if not any(isinstance(h, _ThroughFunctionLogger) for h in package.handlers):
        package.addHandler(_ThroughFunctionLogger())
    # the package logger lets through what the most verbose function wants, and never less
    # than the root logger (a record outside a function is the root's); each function's own
    # level is applied per record by the handler
    levels = [lg.log_level for lg in _loggers.values()]
    package.setLevel(min(*levels, logging.getLogger().getEffectiveLevel()))
    # In Lambda the runtime's root handler would print every record a second time, as plain
    # text; elsewhere (local mode, tests) records also reach the root logger as usual.
    package.propagate = not _in_lambda()
    return logger


@contextmanager
def running(function_id: str) -> Iterator[None]:
    """Route ``trainguard.*`` records of this context to that function's logger."""
    from trainguard.wiring import WIRING

    token = _running.set(WIRING.function(function_id).service_name)
    try:
        yield
    finally:
        _running.reset(token)
