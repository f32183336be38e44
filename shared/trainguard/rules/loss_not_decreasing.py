"""LossNotDecreasing: the loss has not gone down over ``num_steps`` steps."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from trainguard.format.documents import Mode
from trainguard.rules._common import (
    MODE_PRIORITY,
    NameList,
    NonNegative,
    PositiveInt,
    RegexList,
    loss_inputs,
    loss_value,
    mode_step,
)
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt

#: at most this many saved losses are kept per mode between two checks (see ``_prune``)
MAX_WINDOW = 64


class LossNotDecreasingConfig(RuleConfig):
    collection_names: NameList = None
    tensor_regex: RegexList = None
    use_losses_collection: bool = True
    num_steps: PositiveInt = 10
    diff_percent: NonNegative = 0.0
    #: later SageMaker docs; None disables the check
    increase_threshold_percent: NonNegative | None = 5.0
    mode: Mode | None = None


class Track(BaseModel):
    """One mode's losses since its last check: ``(mode step, loss)``, oldest first."""

    model_config = ConfigDict(extra="forbid")

    window: list[tuple[int, float]] = Field(default_factory=list)
    last_check: int | None = None
    best: float | None = None


class LossNotDecreasingState(RuleState):
    tracks: dict[str, Track] = Field(default_factory=dict)
    #: comparisons made, and losses received
    checks: int = 0
    losses_seen: int = 0


class LossNotDecreasing(Rule[LossNotDecreasingConfig, LossNotDecreasingState]):
    """Fires when the loss at a check step is not lower than the loss ``num_steps`` earlier.

    Reads the loss of one mode (scalars in the ``losses`` collection unless
    ``use_losses_collection`` is False, plus scalars/tensors chosen by ``collection_names`` or
    ``tensor_regex``; averaged over workers). Steps are counted in that mode's own steps
    (``mode_step``), as SageMaker counts ``trial.steps(mode)``.

    Checks: the first saved loss starts the schedule; a saved step ``s`` is a check when
    ``s >= last_check + num_steps``, and its loss is compared with the newest saved loss at a
    step ``<= s - num_steps`` (SageMaker's example: losses every 3 steps, num_steps 10: step 21
    is compared with step 9, the next check is step 33). It fires unless the loss is lower
    by at least ``diff_percent`` % of the earlier loss (0: any decrease passes; equal fails).

    Choices where the documentation left room:

    - ``mode`` None: every mode in EVAL, TRAIN, GLOBAL order is tracked separately and only the
      highest-priority mode that has saved a loss so far can fire; lower ones are dropped
      once a higher one appears (deterministic per step, independent of delivery).
    - ``increase_threshold_percent`` (later docs, "maximum percent the loss may increase"): at
      a check, it also fires when the loss exceeds the lowest loss saved earlier in that mode
      by more than this percent. None disables it.
    - A NaN loss at a check is "not lower" and fires.
    - State keeps at most ``MAX_WINDOW`` losses per mode; with ``num_steps`` above that and a
      loss every step, older entries are thinned, so the baseline can be a few steps older
      than the exact one.
    """

    name = "LossNotDecreasing"
    Config = LossNotDecreasingConfig
    State = LossNotDecreasingState
    summary = "The loss has not decreased over num_steps steps."
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
        modes = "/".join(state.tracks) or "/".join(self._modes())
        received = [state.losses_seen] + [state.losses_seen] * (len(self.reads()) - 1)
        reason = (
            f"{state.losses_seen:,} losses arrived but never two at least num_steps="
            f"{self.config.num_steps} steps apart in one mode"
            if state.losses_seen
            else ""
        )
        return self.covered(
            state.checks, f"windows of {modes} loss", "compared", received=received, reason=reason
        )

    def update(
        self, state: LossNotDecreasingState, step: StepData
    ) -> tuple[LossNotDecreasingState, list[Finding]]:
        cfg = self.config
        candidates = self._modes()
        losses: dict[Mode, float] = {}
        for mode in candidates:
            value = loss_value(
                step,
                mode,
                collections=cfg.collection_names,
                regex=cfg.tensor_regex,
                use_losses_collection=cfg.use_losses_collection,
            )
            if value is not None:
                losses[mode] = value
        seen = [m for m in candidates if m in losses or m in state.tracks]
        if not seen:
            return state, []
        chosen = seen[0]
        # lower-priority modes can never be chosen again
        for mode in candidates[candidates.index(chosen) + 1 :]:
            state.tracks.pop(mode, None)
        if chosen not in losses:
            return state, []
        state.losses_seen += 1
        track = state.tracks.setdefault(chosen, Track())
        before = track.last_check
        finding = self._observe(track, mode_step(step, chosen), losses[chosen], step.step, chosen)
        if before is not None and track.last_check != before:
            state.checks += 1
        return state, [finding] if finding else []

    def _observe(self, track: Track, s: int, loss: float, global_step: int, mode: Mode) -> Finding | None:
        cfg = self.config
        if track.last_check is None:
            track.last_check = s
            track.window = [(s, loss)]
            track.best = loss if loss == loss else None
            return None
        if s < track.last_check + cfg.num_steps:
            if track.window and track.window[-1][0] >= s:
                return None  # a repeated (or older) mode step: the first one counts
            track.window.append((s, loss))
            self._prune(track, s)
            self._record_best(track, loss)
            return None
        base_step, base = max((e for e in track.window if e[0] <= s - cfg.num_steps), key=lambda e: e[0])
        best = track.best
        track.last_check = s
        track.window = [(s, loss)]
        self._record_best(track, loss)
        where = f"{mode} step {s}" if s == global_step else f"{mode} step {s} (global step {global_step})"
        decreased = loss < base and (base - loss) >= abs(base) * cfg.diff_percent / 100.0
        if not decreased:
            return self.finding(
                global_step,
                f"{self.name}: {mode} loss at {where} is {fmt(loss)}, not lower than {fmt(base)} at "
                f"{mode} step {base_step} by at least diff_percent={fmt(cfg.diff_percent)}% "
                f"(num_steps={cfg.num_steps}).",
                tensor=f"{mode} loss",
                value=loss,
                threshold=base,
            )
        pct = cfg.increase_threshold_percent
        if pct is not None and best is not None and loss > best + abs(best) * pct / 100.0:
            return self.finding(
                global_step,
                f"{self.name}: {mode} loss at {where} is {fmt(loss)}, more than "
                f"increase_threshold_percent={fmt(pct)}% above the lowest loss so far {fmt(best)}.",
                tensor=f"{mode} loss",
                value=loss,
                threshold=best + abs(best) * pct / 100.0,
            )
        return None

    @staticmethod
    def _record_best(track: Track, loss: float) -> None:
        if loss == loss and (track.best is None or loss < track.best):  # NaN never becomes the best
            track.best = loss

    def _prune(self, track: Track, current: int) -> None:
        """Drop losses that can no longer be the baseline of the next check.

        The next check ``s`` is after ``current`` and at or after ``last_check + num_steps``,
        so its baseline is the newest loss at or before ``max(last_check, current + 1 - num_steps)``
        or a later one: anything older than that newest one is dead.
        """
        assert track.last_check is not None
        horizon = max(track.last_check, current + 1 - self.config.num_steps)
        keep_from = max(i for i, (s, _) in enumerate(track.window) if s <= horizon)
        del track.window[:keep_from]
        if len(track.window) > MAX_WINDOW:
            # thin the middle: keep the oldest (live baseline) and every other later entry
            head, rest = track.window[0], track.window[1:]
            track.window = [head, *rest[(len(rest) - 1) % 2 :: 2]]
