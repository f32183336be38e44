"""SimilarAcrossRuns: two jobs that should be identical produce different tensors.

Pure logic: this rule needs the same step of another job, so the evaluator must call
``compare`` (``update`` alone never fires). Wiring is the engine's job: for each step of this
job, fetch the other job's step (``other_trials``) and pass both.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field

from trainguard.rules._common import NameList, RegexList, select, split_list, tensor_input
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt
from trainguard.rules.unchanged_tensor import FINGERPRINT, allclose, fingerprint

RTOL = 1e-5
ATOL = 1e-8
STATISTICS = ("min", "max", "mean", "l2")


class SimilarAcrossRunsConfig(RuleConfig):
    #: the other job's name (required; SageMaker takes a list of trials, the first is used)
    other_trials: Annotated[tuple[str, ...], BeforeValidator(split_list), Field(min_length=1)]
    collection_names: NameList = None
    tensor_regex: RegexList = None

    @property
    def other_job(self) -> str:
        return self.other_trials[0]


class SimilarAcrossRunsState(RuleState):
    steps_compared: int = 0
    tensors_compared: int = 0
    #: selected tensors of this job (counted by ``update``)
    tensors_seen: int = 0
    #: steps of this job the other job holds no data for (not compared)
    steps_unmatched: int = 0


class SimilarAcrossRuns(Rule[SimilarAcrossRunsConfig, SimilarAcrossRunsState]):
    """Fires when a tensor saved by both jobs at the same step differs between them.

    Reads the selected tensors (``collection_names``/``tensor_regex``; neither: every
    tensor) of this job and of ``other_trials`` at the same step, same mode and worker.
    Approximation: tensors are compared by their statistics' fingerprint (min, max, mean,
    L2 norm; see UnchangedTensor) with numpy's default tolerances (rtol 1e-5, atol 1e-8);
    tensors saved by only one job are not compared, and steps the other job did not save
    are counted (``steps_unmatched``).

    Authorisation: naming a job in ``other_trials`` is not permission to read it. The other
    job must allow the comparison in its own manifest (``allow_comparison_from``: this job's
    name or a ``*`` pattern matching it, which only the other job's writer can set). A job
    that did not allow it, or that cannot be read (AccessDenied, no manifest, not a job of
    the same stack), ends this rule ``Error`` with the reason: a rule cannot have passed a
    job it never compared. What the rule reports stays this job's: the tensor, the step and
    which statistics differ, with this job's own values; never the other job's values or
    the size of the difference (which would give them away).

    Interface: ``kind = "cross-job"``. ``update`` records nothing and never fires; the
    evaluator calls ``compare(state, step, other_step)`` with the other job's StepData for
    the same step, or None when the other job holds nothing at that step.
    """

    name = "SimilarAcrossRuns"
    Config = SimilarAcrossRunsConfig
    State = SimilarAcrossRunsState
    kind = "cross-job"
    summary = "Tensors differ between this job and another job at the same step."
    advice = (
        "Check what differs between the runs: seeds, data order, library versions, "
        "non-deterministic kernels (torch.use_deterministic_algorithms) and hyperparameters."
    )

    def compares_with(self) -> str:
        return self.config.other_job

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        return (tensor_input(cfg.collection_names, cfg.tensor_regex, FINGERPRINT),)

    def coverage(self, state: SimilarAcrossRunsState) -> Coverage:
        reason = ""
        if state.steps_compared:
            reason = (
                f"{state.steps_compared:,} steps were matched with job {self.config.other_job} but no "
                "selected tensor with min/max/mean/l2 was saved by both at the same step, mode and worker"
            )
        elif not reason:
            reason = (
                f"no step of job {self.config.other_job} was found at the steps this job saved (is it "
                "written under the same bucket, and readable?)"
            )
        return self.covered(
            state.tensors_compared,
            "tensors compared across jobs",
            "compared",
            received=[state.tensors_seen],
            reason=reason,
        )

    def update(
        self, state: SimilarAcrossRunsState, step: StepData
    ) -> tuple[SimilarAcrossRunsState, list[Finding]]:
        cfg = self.config
        state.tensors_seen += sum(1 for _ in select(step, cfg.collection_names, cfg.tensor_regex))
        return state, []

    def compare(
        self, state: SimilarAcrossRunsState, step: StepData, other: StepData | None
    ) -> tuple[SimilarAcrossRunsState, list[Finding]]:
        if other is None:
            state.steps_unmatched += 1
            return state, []
        if step.step != other.step:
            raise ValueError(f"compare steps {step.step} and {other.step}: they must be the same step")
        cfg = self.config
        theirs = {
            (v.worker, v.mode, v.name): s for v, s in select(other, cfg.collection_names, cfg.tensor_regex)
        }
        state.steps_compared += 1
        for view, stats in select(step, cfg.collection_names, cfg.tensor_regex):
            other_stats = theirs.get((view.worker, view.mode, view.name))
            if other_stats is None:
                continue
            ours, reference = fingerprint(stats), fingerprint(other_stats)
            if ours is None or reference is None:
                continue  # not computed on one side: not compared
            state.tensors_compared += 1
            if not allclose(ours, reference, RTOL, ATOL, equal_nan=True):
                differ = [
                    name
                    for name, a, b in zip(STATISTICS, ours, reference, strict=True)
                    if not allclose([a], [b], RTOL, ATOL, equal_nan=True)
                ]
                mine = ", ".join(f"{name} {fmt(a)}" for name, a in zip(STATISTICS, ours, strict=True))
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: {view.name} (worker {view.worker}, {view.mode}) differs from job "
                        f"{cfg.other_job} at step {step.step}: its {'/'.join(differ)} "
                        f"{'is' if len(differ) == 1 else 'are'} not within rtol={RTOL}, atol={ATOL} "
                        f"of the other job's (this job: {mine}).",
                        tensor=view.name,
                        threshold=RTOL,
                    )
                ]
        return state, []
