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


class SimilarAcrossRuns(Rule[SimilarAcrossRunsConfig, SimilarAcrossRunsState]):
    """Fires when a tensor saved by both jobs at the same step differs between them.

    Reads the selected tensors (``collection_names``/``tensor_regex``; neither: every
    tensor) of this job and of ``other_trials`` at the same step, same mode and worker.
    Approximation: tensors are compared by their statistics' fingerprint (min, max, mean,
    L2 norm; see UnchangedTensor) with numpy's default tolerances (rtol 1e-5, atol 1e-8);
    tensors saved by only one job are not compared.

    Interface: ``kind = "cross-job"``. ``update`` records nothing and never fires; the
    evaluator calls ``compare(state, step, other_step)`` with the other job's StepData for
    the same step.
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
        self, state: SimilarAcrossRunsState, step: StepData, other: StepData
    ) -> tuple[SimilarAcrossRunsState, list[Finding]]:
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
            a, b = fingerprint(stats), fingerprint(other_stats)
            if a is None or b is None:
                continue  # not computed on one side: not compared
            state.tensors_compared += 1
            if not allclose(a, b, RTOL, ATOL, equal_nan=True):
                diff = max(abs(x - y) for x, y in zip(a, b, strict=True))
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: {view.name} (worker {view.worker}, {view.mode}) differs from job "
                        f"{cfg.other_job}: min/max/mean/l2 {[fmt(x) for x in a]} vs {[fmt(x) for x in b]} "
                        f"(largest difference {fmt(diff)}; rtol={RTOL}, atol={ATOL}).",
                        tensor=view.name,
                        value=diff,
                        threshold=ATOL,
                    )
                ]
        return state, []
