"""LossDivergence: the loss grew by orders of magnitude while still finite."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from trainguard.format.documents import Mode
from trainguard.rules._common import MODE_PRIORITY, NameList, RegexList, loss_inputs, loss_value
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt
from trainguard.rules.noise import RobustNoise

#: how many noise standard deviations make the loss's own scale (besides its level)
NOISE_SCALE = 5.0


class LossDivergenceConfig(RuleConfig):
    collection_names: NameList = None
    tensor_regex: RegexList = None
    use_losses_collection: bool = True
    #: None: every mode that saves losses, each judged on its own
    mode: Mode | None = None
    #: a loss this many times its own scale above its recent level, confirmed by the next loss
    factor: float = Field(default=10.0, gt=1, allow_inf_nan=False)
    #: a loss this many times its scale above the level fires at once, without confirmation
    immediate_factor: float = Field(default=1000.0, gt=1, allow_inf_nan=False)
    #: recent finite losses the level and noise are estimated from
    window: int = Field(default=32, ge=8, le=128)


class Track(BaseModel):
    """One mode's recent losses and a jump waiting for the next loss to confirm it."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    noise: RobustNoise = Field(default_factory=RobustNoise)
    #: the loss that jumped (and its global step), while the next one is awaited
    pending: float | None = None
    pending_at: int = 0


class LossDivergenceState(RuleState):
    tracks: dict[str, Track] = Field(default_factory=dict, max_length=len(MODE_PRIORITY))
    losses_seen: int = 0
    #: losses judged against a ready estimate
    judged: int = 0


class LossDivergence(Rule[LossDivergenceConfig, LossDivergenceState]):
    """Fires when a finite loss exceeds its recent level by ``factor`` x its own scale and the
    next loss confirms it (still that far above, or not finite), or by ``immediate_factor`` x
    the scale at once.

    Test: per mode, the level is the median of the last ``window`` finite losses and the noise
    is their robust noise (``trainguard.rules.noise``); the scale is the largest of ``|level|``,
    5 x the noise and the window's largest excursion from the level.
    A loss above ``level + factor x scale`` (10: an order of magnitude of the loss itself, and
    far beyond its noise) is a jump; a jump confirmed by the next loss, or one of three orders
    of magnitude, is a divergence. Judged once ``window`` has 8 losses (the first steps of a job
    are its own scale). A character-level GRU whose learning rate was multiplied by 1e4 went
    from 2.9 to 1.4e5 (then 6e33, then NaN): a divergence at its first jump or the step after.

    Not a divergence: a warm-up or a schedule restart (the loss back up 2-3x: below 10x its
    level), one hard batch (not confirmed), a near-zero loss's relative spikes (its noise sets
    its scale), a switch between TRAIN and EVAL (each mode has its own track). NaN or Inf alone
    is ExplodingTensor's finding; here it only confirms a jump that came before it.
    """

    name = "LossDivergence"
    Config = LossDivergenceConfig
    State = LossDivergenceState
    summary = "The loss grew by orders of magnitude against its own recent scale while still finite."
    advice = (
        "Lower the learning rate (or restore the last good schedule), clip gradients, check "
        "mixed-precision loss scaling; restart from the last checkpoint before the jump."
    )
    method = (
        "per mode: loss > median of the last 32 losses + 10 x max(|median|, 5 x robust noise, "
        "largest recent excursion), "
        "confirmed by the next loss, or 1000 x at once"
    )
    false_alarm_budget = (
        "at most 1 per 100 healthy jobs: a rise of 10x the loss's own level, sustained two "
        "steps, is not seen in healthy training (warm-ups and restarts move it 2-3x)"
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

    def coverage(self, state: LossDivergenceState) -> Coverage:
        received = [state.losses_seen] * len(self.reads())
        reason = ""
        if state.losses_seen:
            reason = f"{state.losses_seen:,} losses arrived, fewer than 8 finite ones in any mode"
        return self.covered(
            state.judged, "losses against their recent scale", "judged", received=received, reason=reason
        )

    def update(self, state: LossDivergenceState, step: StepData) -> tuple[LossDivergenceState, list[Finding]]:
        cfg = self.config
        findings: list[Finding] = []
        for mode in self._modes():
            value = loss_value(
                step,
                mode,
                collections=cfg.collection_names,
                regex=cfg.tensor_regex,
                use_losses_collection=cfg.use_losses_collection,
            )
            if value is None:
                continue
            state.losses_seen += 1
            track = state.tracks.get(mode)
            if track is None:
                track = state.tracks[mode] = Track(noise=RobustNoise(size=cfg.window))
            findings += self._observe(state, track, mode, value, step.step)
        return state, findings[:1]

    def _observe(
        self, state: LossDivergenceState, track: Track, mode: Mode, value: float, at: int
    ) -> list[Finding]:
        cfg = self.config
        level, sigma = track.noise.level(), track.noise.sigma()
        if level is None or sigma is None:
            track.noise.add(value)
            return []
        state.judged += 1
        # the largest recent excursion counts too: a loss that is mostly 0 (a hinge) has no
        # level, and its occasional non-zero batches are its scale
        spread = max(abs(v - level) for v in track.noise.values)
        scale = max(abs(level), NOISE_SCALE * sigma, spread, 1e-12)
        excess = (value - level) / scale if math.isfinite(value) else math.inf
        pending, track.pending = track.pending, None
        if pending is not None and excess < cfg.factor:
            track.noise.add(pending)  # not confirmed: one hard batch, part of the loss's scale
        if pending is not None and excess >= cfg.factor:
            return [self._finding(mode, at, pending, value, level, scale, confirmed=True)]
        if math.isfinite(excess) and excess >= cfg.immediate_factor:
            return [self._finding(mode, at, value, None, level, scale, confirmed=False)]
        if math.isfinite(excess) and excess >= cfg.factor:
            track.pending, track.pending_at = value, at  # kept out of the window until judged
            return []
        track.noise.add(value)  # a rejected jump (one hard batch) was not added: the median holds
        return []

    def _finding(
        self,
        mode: Mode,
        at: int,
        jump: float,
        then: float | None,
        level: float,
        scale: float,
        *,
        confirmed: bool,
    ) -> Finding:
        cfg = self.config
        times = (jump - level) / scale
        text = (
            f"{self.name}: {mode} loss rose to {fmt(jump)} from a recent level of {fmt(level)} "
            f"({fmt(times)} x its scale {fmt(scale)}"
        )
        if confirmed:
            text += f"; the next loss, {fmt(then)}, confirmed it: factor={fmt(cfg.factor)})."
        else:
            text += f" >= immediate_factor={fmt(cfg.immediate_factor)})."
        return self.finding(
            at,
            text,
            tensor=f"{mode} loss",
            value=jump,
            threshold=level + (cfg.factor if confirmed else cfg.immediate_factor) * scale,
        )
