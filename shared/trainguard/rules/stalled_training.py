"""StalledTrainingRule: the job has written nothing for ``threshold`` seconds.

Pure logic: a stalled job uploads nothing, so no step event will ever arrive to run the
check. The evaluator must call ``check(state, now)`` from a timer (e.g. an EventBridge
schedule); ``update`` only records when data last arrived.
"""

from __future__ import annotations

from pydantic import Field

from trainguard.rules._common import PositiveInt
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleState, StepData, fmt


class StalledTrainingRuleConfig(RuleConfig):
    threshold: PositiveInt = 1800
    stop_training_on_fire: bool = False
    training_job_name_prefix: str | None = Field(default=None, max_length=256)


class StalledTrainingRuleState(RuleState):
    #: the newest step seen and when it was written (the hook's wall clock, seconds)
    last_step: int | None = None
    last_time: float | None = None
    #: steps whose arrival was timed
    steps_seen: int = 0


class StalledTrainingRule(Rule[StalledTrainingRuleConfig, StalledTrainingRuleState]):
    """Fires when no new step has been written for ``threshold`` seconds.

    ``update`` records the newest step's ``wall_time`` (the latest worker's); ``check(state,
    now)``, called by a timer with the current time (``time.time()``), fires when
    ``now - last_time > threshold``. Before any step arrives there is nothing to measure
    from: ``check(state, now, started=job_start)`` measures from the job's start instead.

    Choices: the clock is the training hosts' (``wall_time`` in the step header), so a
    large clock skew between the trainer and the service shifts the verdict by that skew;
    ``stop_training_on_fire`` and ``training_job_name_prefix`` are carried for the action
    layer (the rule only reports). ``kind = "clock"``.
    """

    name = "StalledTrainingRule"
    Config = StalledTrainingRuleConfig
    State = StalledTrainingRuleState
    kind = "clock"
    uses_clock = True
    summary = "The job has saved no new step for threshold seconds: training is stalled."
    advice = (
        "Look at the job's logs for a hang (deadlocked data loader, NCCL timeout, stuck I/O); "
        "stop it to stop paying for idle instances."
    )

    def coverage(self, state: StalledTrainingRuleState) -> Coverage:
        reason = "" if state.steps_seen else "the job wrote no step, so no gap between steps could be timed"
        return self.covered(state.steps_seen, "steps' write times", "timed", reason=reason)

    def update(
        self, state: StalledTrainingRuleState, step: StepData
    ) -> tuple[StalledTrainingRuleState, list[Finding]]:
        state.steps_seen += 1
        if state.last_step is None or step.step >= state.last_step:
            state.last_step = step.step
        if state.last_time is None or step.wall_time > state.last_time:
            state.last_time = step.wall_time
        return state, []

    def check(
        self, state: StalledTrainingRuleState, now: float, *, started: float | None = None
    ) -> tuple[StalledTrainingRuleState, list[Finding]]:
        since = state.last_time if state.last_time is not None else started
        if since is None:
            return state, []
        idle = now - since
        if idle > self.config.threshold:
            at = state.last_step if state.last_step is not None else 0
            what = f"since step {state.last_step}" if state.last_step is not None else "since the job started"
            return state, [
                self.finding(
                    at,
                    f"{self.name}: no new data for {fmt(idle)} s {what} > "
                    f"threshold={self.config.threshold} s.",
                    tensor=None,
                    value=idle,
                    threshold=float(self.config.threshold),
                )
            ]
        return state, []
