"""LossNotDecreasing: the loss stalled (never fell, or stopped at once), judged on its noise."""

from __future__ import annotations

import math
from dataclasses import replace

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
from trainguard.rules._trend import FALL_Z, MAX_HORIZON, BlockTrend, Verdict, judge
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt
from trainguard.rules.noise import RobustNoise

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
    #: given: SageMaker's test (each block lower than the previous by this percent); None:
    #: the noise-aware stall test
    diff_percent: NonNegative | None = None
    #: the later SageMaker documentation's parameter; None (the default) disables the check
    increase_threshold_percent: NonNegative | None = None
    mode: Mode | None = None
    #: blocks after the first of a plateau: a stall is ``horizon + 1`` blocks within noise
    horizon: int = Field(default=3, ge=1, le=MAX_HORIZON)

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
    #: the noise-aware test: the loss's noise and its recent block means
    noise: RobustNoise = Field(default_factory=lambda: RobustNoise(size=32))
    trend: BlockTrend = Field(default_factory=BlockTrend)


class LossNotDecreasingState(RuleState):
    tracks: dict[str, Track] = Field(default_factory=dict, max_length=len(MODE_PRIORITY))
    clock: TrainingClock = Field(default_factory=TrainingClock)
    #: comparisons made, and losses received
    checks: int = 0
    losses_seen: int = 0
    #: some mode's block mean fell below its first loss beyond noise: the model learned
    learned: bool = False


class LossNotDecreasing(Rule[LossNotDecreasingConfig, LossNotDecreasingState]):
    """Fires when the loss has stalled: flat within its own noise for ``horizon + 1`` blocks
    of ``num_steps`` training steps, having never fallen, or having stopped falling at once.

    Reads the loss of one mode (scalars in the ``losses`` collection unless
    ``use_losses_collection`` is False, plus scalars/tensors chosen by ``collection_names`` or
    ``tensor_regex``; averaged over workers).

    Test (``diff_percent`` not given). Each block's mean loss is kept with its size; the
    loss's noise is its robust per-loss noise (``trainguard.rules.noise``), so a block of n
    losses has noise ``sigma / sqrt(n)``. A plateau is ``horizon + 1`` (4) block means within
    4.5 x that noise. A plateau is a stall when the loss never moved (every block so far
    within 6 x the noise and the first loss not 4 x its noise above) or when its decline
    stopped at once: the two falls before the plateau, extrapolated as the geometric decline
    they show, predicted a further fall the plateau lacks by 4 x the noise (``_trend``). A
    converged loss (its falls faded block by block, as its own ratio predicted) is not a
    stall: that is ``LossConverged``, off the alert path unless configured. A loss that moves
    (falls, rises, wanders like an adversarial loss) is not a plateau; a rise by orders of
    magnitude is ``LossDivergence``'s. A character-level GRU's EVAL loss at 0.708 vs 0.703 a
    block earlier is a converged plateau; a learning rate cut 1e6-fold mid-decline is a stop.
    With 50-step blocks a stall is named 150-250 training steps after it began.

    ``diff_percent`` given (SageMaker's test, its meaning kept): a block's mean not lower than
    the previous block's by ``diff_percent`` % fires; an exactly flat loss (equal means,
    1e-9 relative) is "not lower", also at 0. A NaN in a block fires in either test.

    Schedule (SageMaker's): the first saved loss starts it; the first loss at a training step
    ``t >= last_check + num_steps`` is a check. SageMaker compares the loss at the check with
    the newest loss saved ``num_steps`` earlier; trainguard compares block means (with one loss
    per block, as at SageMaker's 500-step cadence, this is SageMaker's comparison).

    Units. Windows are training steps (see ``TrainingClock``), in every mode: an evaluation's
    EVAL losses all belong to the training step it followed, so EVAL blocks compare
    evaluations ``num_steps`` training steps apart. trainguard's default ``num_steps`` is 50
    training steps; an explicit value is training steps between checks, as SageMaker documents.

    ``mode`` None (SageMaker: EVAL if available, else TRAIN, else GLOBAL): each mode is
    tracked; a mode's verdicts count until a higher-priority mode has made its first
    comparison, then the lower modes are dropped.

    ``increase_threshold_percent`` (only in a later version of SageMaker's documentation):
    when given, a check also fires when the block mean exceeds the lowest block mean so far by
    more than that percent. Off by default.

    False-alarm budget: a plateau of pure noise spreads beyond 4.5 noises in about 1 % of
    windows, and a stall needs the whole history within 6 noises, so a healthy job that fell
    is never "stalled"; a job that starts at its floor (fine-tuning a converged model) is.
    """

    name = "LossNotDecreasing"
    Config = LossNotDecreasingConfig
    State = LossNotDecreasingState
    summary = "The loss stalled: flat within its own noise, having never fallen or stopped at once."
    method = (
        "4 block means (num_steps=50 training steps each) within 4.5 x their robust noise, and "
        "the loss never moved (6 x) or its decline stopped against its own geometric trend; "
        "diff_percent given: SageMaker's block comparison"
    )
    false_alarm_budget = (
        "about 1 per 100 healthy jobs: converged, wandering or rising losses are not stalls; a job "
        "that starts at its floor is"
    )
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
            track.noise.add(value)
            if track.trend.first is None and math.isfinite(value):
                track.trend.first = value
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
        track_n = track.block_n
        span = (track.block_first or 0, track.block_last or 0)
        at, base, base_span, best = track.block_global, track.base, track.base_span, track.best
        track.last_check, track.closing = track.closing, None
        track.block_sum, track.block_n, track.block_first, track.block_last = 0.0, 0, None, None
        track.base, track.base_span = mean, span
        if mean == mean and (track.best is None or mean < track.best):
            track.best = mean
        if cfg.diff_percent is None:
            track.trend.add(mean, max(track_n, 1), cfg.horizon)
        if base is None or base_span is None:
            return []  # the first block: nothing to compare with yet
        track.checks += 1
        state.checks += 1
        if not self._chosen(state, mode):
            return []
        what = f"{mode} loss over training steps {span[0]}-{span[1]}"
        # the block's last training step is what the loop printed at the step it fired for
        clock_mode: Mode = "TRAIN" if state.clock.trained else "GLOBAL"
        before = f"{fmt(base)} over steps {base_span[0]}-{base_span[1]}"
        if cfg.diff_percent is None:
            if not math.isfinite(mean):
                return [
                    self.finding(
                        at,
                        f"{self.name}: mean {what} is {fmt(mean)}.",
                        tensor=f"{mode} loss",
                        mode=clock_mode,
                        mode_step=span[1],
                        value=mean,
                        threshold=base,
                    )
                ]
            sigma = track.noise.sigma()
            first = track.trend.first
            if sigma is not None and first is not None and first - mean >= FALL_Z * sigma:
                state.learned = True
            verdict = judge(track.trend, sigma, cfg.horizon, learned=state.learned)
            found = self._trend_finding(verdict, mode, what, mean, at)
            if found:
                return [replace(f, mode=clock_mode, mode_step=span[1]) for f in found]
        elif not mean < base - max(abs(base) * cfg.diff_percent / 100.0, abs(base) * EQUAL_RTOL):
            # NaN compares False: a NaN block fires
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

    def _trend_finding(self, verdict: Verdict, mode: Mode, what: str, mean: float, at: int) -> list[Finding]:
        """A stall (never fell, or stopped at once) is this rule's finding."""
        cfg = self.config
        blocks = f"{cfg.horizon + 1} blocks of num_steps={cfg.window} training steps"
        flat = (
            f"{self.name}: mean {what} is {fmt(mean)}; the last {blocks} lie within "
            f"{fmt(verdict.spread)} of each other, within the noise of a block mean ({fmt(verdict.noise)})"
        )
        if verdict.kind == "stalled":
            text = f"{flat}, and the loss has not moved since its first value: it is not learning."
        elif verdict.kind == "stopped":
            text = (
                f"{flat}; its decline stopped at once: the falls before predicted a further "
                f"{fmt(verdict.predicted)}, it fell {fmt(verdict.observed)}."
            )
        else:
            return []
        return [self.finding(at, text, tensor=f"{mode} loss", value=mean, threshold=verdict.noise)]

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
