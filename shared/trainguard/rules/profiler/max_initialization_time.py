"""MaxInitializationTime: no training step has started ``threshold`` minutes after the hook started.

Reads the batches' ``init`` block (hook start, first step start) and step timings. The job's
start is the earliest ``hook_start`` of any worker; its first step is the earliest step
start of any worker. Fires when

* the first step started more than ``threshold`` minutes after the start (initialisation was
  too slow: reported when the first step's data arrives), or
* a batch ends more than ``threshold`` minutes after the start and no step has started, or
* :meth:`MaxInitializationTime.check_clock` is called (by the service's schedule: a job
  stuck in initialisation may send little or nothing) with ``now`` more than ``threshold``
  minutes after the start and no step seen. ``job_start`` (the manifest's creation time)
  stands in when no batch arrived yet.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from trainguard.format.system import SystemBatch
from trainguard.rules.base import Finding, RuleConfig, fmt
from trainguard.rules.profiler.base import ProfilerRule, ProfilerState


class MaxInitializationTimeConfig(RuleConfig):
    threshold: float = Field(default=20.0, gt=0)


class MaxInitializationTimeState(ProfilerState):
    hook_start: float | None = None
    first_step_start: float | None = None
    latest: float | None = None
    fired: bool = False


class MaxInitializationTime(ProfilerRule[MaxInitializationTimeConfig, MaxInitializationTimeState]):
    """Fires when no step started ``threshold`` minutes after the hook; ``check_clock`` for the timer.

    Details and the choices made are in the module docstring.
    """

    name = "MaxInitializationTime"
    uses_clock = True
    Config = MaxInitializationTimeConfig
    State = MaxInitializationTimeState
    summary = "no training step has started `threshold` minutes after the job started"
    advice = (
        "Initialisation is slow: look at data download or preparation before the loop (stream or "
        "use a faster input mode), model download or compilation, and waiting for other workers."
    )

    def _update(
        self, state: MaxInitializationTimeState, batch: SystemBatch
    ) -> tuple[MaxInitializationTimeState, list[Finding]]:
        if batch.init is not None:
            state.hook_start = _min(state.hook_start, batch.init.hook_start)
            state.first_step_start = _min(state.first_step_start, batch.init.first_step_start)
        for event in batch.steps:
            state.first_step_start = _min(state.first_step_start, event.start)
        state.latest = batch.end_time if state.latest is None else max(state.latest, batch.end_time)
        return self._judge(state, state.latest)

    def check_clock(
        self, state: MaxInitializationTimeState, now: float, job_start: float | None = None
    ) -> tuple[MaxInitializationTimeState, list[Finding]]:
        """Judge at wall-clock ``now`` with no new data (pure; the scheduler calls it)."""
        state = state.model_copy(deep=True)
        if state.hook_start is None and job_start is not None:
            state.hook_start = job_start
        return self._judge(state, now)

    def _judge(
        self, state: MaxInitializationTimeState, now: float | None
    ) -> tuple[MaxInitializationTimeState, list[Finding]]:
        if state.fired or state.hook_start is None:
            return state, []
        limit = self.config.threshold * 60.0
        if state.first_step_start is not None:
            took = state.first_step_start - state.hook_start
            if took > limit:
                state.fired = True
                return state, [
                    self.finding(
                        0,
                        f"The first training step started {fmt(took / 60)} minutes after the hook started "
                        f"(threshold {fmt(self.config.threshold)} minutes).",
                        value=took / 60,
                        threshold=self.config.threshold,
                    )
                ]
            return state, []
        if now is not None and now - state.hook_start > limit:
            state.fired = True
            waited = (now - state.hook_start) / 60
            return state, [
                self.finding(
                    0,
                    f"No training step has started {fmt(waited)} minutes after the hook started "
                    f"(threshold {fmt(self.config.threshold)} minutes).",
                    value=waited,
                    threshold=self.config.threshold,
                )
            ]
        return state, []

    def describe(self, state: MaxInitializationTimeState) -> dict[str, Any]:
        took = (
            state.first_step_start - state.hook_start
            if state.first_step_start is not None and state.hook_start is not None
            else None
        )
        return {"initialization_s": took}


def _min(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
