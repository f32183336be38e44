"""LossNotDecreasing: the loss has not gone down over ``num_steps`` training steps."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from trainguard.format.documents import Mode
from trainguard.rules._common import (
    MODE_PRIORITY,
    NameList,
    NonNegative,
    PositiveInt,
    RegexList,
    TrainingClock,
    loss_inputs,
    loss_value,
)
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt

#: trainguard's ``num_steps`` when none is given (SageMaker's is 10, see the rule's docstring)
DEFAULT_NUM_STEPS = 50
#: two block means closer than this (relative) are equal: a sum of equal floats is not exact
EQUAL_RTOL = 1e-9


class LossNotDecreasingConfig(RuleConfig):
    collection_names: NameList = None
    tensor_regex: RegexList = None
    use_losses_collection: bool = True
    #: training steps between checks (None: ``DEFAULT_NUM_STEPS``)
    num_steps: PositiveInt | None = None
    diff_percent: NonNegative = 0.0
    #: the later SageMaker documentation's parameter; None (the default) disables the check
    increase_threshold_percent: NonNegative | None = None
    mode: Mode | None = None

    @property
    def window(self) -> int:
        return self.num_steps if self.num_steps is not None else DEFAULT_NUM_STEPS


class Track(BaseModel):
    """One mode's blocks: the block being filled, and the mean of the previous one."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    #: training step that closed the previous block (None: no block closed yet)
    last_check: int | None = None
    #: the training step that closes the current block (set once it is reached)
    closing: int | None = None
    block_sum: float = 0.0
    block_n: int = 0
    #: first and last training step, and last global step, of the current block
    block_first: int | None = None
    block_last: int | None = None
    block_global: int = 0
    #: mean of the previous block, and its training-step span
    base: float | None = None
    base_span: tuple[int, int] | None = None
    #: lowest block mean so far (``increase_threshold_percent``)
    best: float | None = None
    checks: int = 0


class LossNotDecreasingState(RuleState):
    tracks: dict[str, Track] = Field(default_factory=dict, max_length=len(MODE_PRIORITY))
    clock: TrainingClock = Field(default_factory=TrainingClock)
    #: comparisons made, and losses received
    checks: int = 0
    losses_seen: int = 0


class LossNotDecreasing(Rule[LossNotDecreasingConfig, LossNotDecreasingState]):
    """Fires when the loss of a block of ``num_steps`` training steps is not lower than the
    previous block's, by at least ``diff_percent`` % of it.

    Reads the loss of one mode (scalars in the ``losses`` collection unless
    ``use_losses_collection`` is False, plus scalars/tensors chosen by ``collection_names`` or
    ``tensor_regex``; averaged over workers).

    Schedule (SageMaker's): the first saved loss starts it; the first loss at a training step
    ``t >= last_check + num_steps`` is a check. SageMaker compares the loss at the check with
    the newest loss saved ``num_steps`` earlier; trainguard compares the *mean* of the losses
    saved since the previous check (the block) with the previous block's mean. With one loss
    per block (losses saved less often than ``num_steps``, as at SageMaker's 500-step cadence)
    this is SageMaker's comparison; with a loss every step it averages mini-batch noise out
    instead of comparing two noisy points (issue 10: the point comparison and the 5% increase
    branch alarmed on 60 of 100 healthy runs). A loss that is exactly flat (equal block means,
    1e-9 relative) is "not lower" and fires, also at ``diff_percent`` 0. A NaN in a block fires.

    Units. Windows are training steps (see ``TrainingClock``), in every mode: an evaluation's
    EVAL losses all belong to the training step it followed, so EVAL blocks compare
    evaluations ``num_steps`` training steps apart. SageMaker counted each mode's own saved
    steps: ``num_steps`` 10 at its 500-step save cadence meant comparing saves 500 or more
    steps apart; 10 EVAL steps of one evaluation loop never compared two evaluations.
    trainguard's default ``num_steps`` is 50 training steps; an explicit value is training
    steps between checks, as SageMaker documents ("the minimum number of steps after which
    the rule checks").

    ``mode`` None (SageMaker: EVAL if available, else TRAIN, else GLOBAL): each mode is
    tracked; a mode's verdicts count until a higher-priority mode has made its first
    comparison, then the lower modes are dropped. So a job whose EVAL losses never span two
    blocks is still judged on TRAIN (a rule that followed 16 EVAL steps and compared nothing
    while TRAIN losses were NaN passed on main).

    ``increase_threshold_percent`` (only in a later version of SageMaker's documentation, with
    other defaults): when given, a check also fires when the block mean exceeds the lowest
    block mean so far by more than that percent. By default it is off, as in the version whose
    ``mode`` and ``diff_percent`` defaults trainguard keeps.
    """

    name = "LossNotDecreasing"
    Config = LossNotDecreasingConfig
    State = LossNotDecreasingState
    summary = "The loss has not decreased over num_steps training steps."
    advice = (
        "Check the learning rate (too high or too low), the optimizer and the data pipeline "
        "(shuffled, labels aligned); stop the job if the loss has plateaued."
    )

    def _modes(self) -> tuple[Mode, ...]:
        return (self.config.mode,) if self.config.mode else MODE_PRIORITY

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        return loss_inputs(
            self._modes(),
            collections=cfg.collection_names,
            regex=cfg.tensor_regex,
            use_losses_collection=cfg.use_losses_collection,
        )

    def coverage(self, state: LossNotDecreasingState) -> Coverage:
        compared = [m for m, t in state.tracks.items() if t.checks]
        modes = "/".join(compared or list(state.tracks) or list(self._modes()))
        received = [state.losses_seen] * len(self.reads())
        reason = ""
        if state.losses_seen:
            reason = (
                f"{state.losses_seen:,} losses arrived, but never two blocks of num_steps="
                f"{self.config.window} training steps in one mode"
            )
        return self.covered(
            state.checks, f"windows of {modes} loss", "compared", received=received, reason=reason
        )

    def update(
        self, state: LossNotDecreasingState, step: StepData
    ) -> tuple[LossNotDecreasingState, list[Finding]]:
        cfg = self.config
        t = state.clock.tick(step)
        findings: list[Finding] = []
        for mode in self._modes():
            if mode not in state.tracks and not self._chosen(state, mode):
                continue  # a higher-priority mode has compared: this one can never count again
            value = loss_value(
                step,
                mode,
                collections=cfg.collection_names,
                regex=cfg.tensor_regex,
                use_losses_collection=cfg.use_losses_collection,
            )
            track = state.tracks.get(mode)
            if value is None:
                if track is not None and track.closing is not None and t > track.closing:
                    findings += self._close(state, track, mode)
                continue
            state.losses_seen += 1
            if track is None:
                track = state.tracks[mode] = Track()
            findings += self._observe(state, track, mode, t, value, step.step)
        self._drop_lower_modes(state)
        return state, findings[:1]

    def finish(self, state: LossNotDecreasingState) -> list[Finding]:
        """The job ended: a block that reached its closing step is judged."""
        findings: list[Finding] = []
        for mode in self._modes():
            track = state.tracks.get(mode)
            if track is not None and track.closing is not None:
                findings += self._close(state, track, mode)
        return findings[:1]

    # -------------------------------------------------------------------------------------
    def _observe(
        self, state: LossNotDecreasingState, track: Track, mode: Mode, t: int, loss: float, at: int
    ) -> list[Finding]:
        findings: list[Finding] = []
        if track.closing is not None and t > track.closing:
            findings = self._close(state, track, mode)
        track.block_sum += loss
        track.block_n += 1
        track.block_first = t if track.block_first is None else track.block_first
        track.block_last, track.block_global = t, at
        if track.closing is None and (track.last_check is None or t >= track.last_check + self.config.window):
            track.closing = t  # the first block is the first loss's training step alone
        return findings

    def _close(self, state: LossNotDecreasingState, track: Track, mode: Mode) -> list[Finding]:
        cfg = self.config
        mean = track.block_sum / track.block_n if track.block_n else math.nan
        span = (track.block_first or 0, track.block_last or 0)
        at, base, base_span, best = track.block_global, track.base, track.base_span, track.best
        track.last_check, track.closing = track.closing, None
        track.block_sum, track.block_n, track.block_first, track.block_last = 0.0, 0, None, None
        track.base, track.base_span = mean, span
        if mean == mean and (track.best is None or mean < track.best):
            track.best = mean
        if base is None or base_span is None:
            return []  # the first block: nothing to compare with yet
        track.checks += 1
        state.checks += 1
        if not self._chosen(state, mode):
            return []
        margin = max(abs(base) * cfg.diff_percent / 100.0, abs(base) * EQUAL_RTOL)
        what = f"{mode} loss over training steps {span[0]}-{span[1]}"
        # the block's last training step is what the loop printed at the step it fired for
        clock_mode: Mode = "TRAIN" if state.clock.trained else "GLOBAL"
        before = f"{fmt(base)} over steps {base_span[0]}-{base_span[1]}"
        if not mean < base - margin:  # NaN compares False: a NaN block fires
            return [
                self.finding(
                    at,
                    f"{self.name}: mean {what} is {fmt(mean)}, not lower than {before} by at least "
                    f"diff_percent={fmt(cfg.diff_percent)}% (num_steps={cfg.window} training steps).",
                    tensor=f"{mode} loss",
                    mode=clock_mode,
                    mode_step=span[1],
                    value=mean,
                    threshold=base,
                )
            ]
        pct = cfg.increase_threshold_percent
        if pct is not None and best is not None and mean > best + abs(best) * pct / 100.0:
            return [
                self.finding(
                    at,
                    f"{self.name}: mean {what} is {fmt(mean)}, more than increase_threshold_percent="
                    f"{fmt(pct)}% above the lowest block mean so far {fmt(best)}.",
                    tensor=f"{mode} loss",
                    mode=clock_mode,
                    mode_step=span[1],
                    value=mean,
                    threshold=best + abs(best) * pct / 100.0,
                )
            ]
        return []

    def _chosen(self, state: LossNotDecreasingState, mode: Mode) -> bool:
        """A mode's verdict counts while no higher-priority mode has compared anything."""
        modes = self._modes()
        higher = modes[: modes.index(mode)]
        return not any(m in state.tracks and state.tracks[m].checks for m in higher)

    def _drop_lower_modes(self, state: LossNotDecreasingState) -> None:
        modes = self._modes()
        for i, mode in enumerate(modes):
            track = state.tracks.get(mode)
            if track is not None and track.checks:
                for lower in modes[i + 1 :]:
                    state.tracks.pop(lower, None)
                return
