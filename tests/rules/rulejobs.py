"""Hand-made jobs for the golden rule tests: StepHeader objects built directly.

(A uniquely named module rather than ``conftest.py``: test files import these helpers, and
``from conftest import`` would clash with any other directory's conftest.)

``step_data(...)`` builds one global step; ``run(rule, steps)`` drives a rule like the
evaluator does (update in step order, stop at the first finding, ``finish`` at the end).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from trainguard.format.documents import ModeRecord, ScalarRecord, StepHeader, TensorRecord, TensorStats
from trainguard.rules.base import Finding, Rule, RuleState, StepData
from trainguard.rules.config import parse_rule_configurations

JOB = "golden-job"
#: steps in the state-size tests: rules whose state holds a container (a window, per-class
#: or per-tensor maps) run LONG steps; rules whose state is only scalars (bounded by
#: construction, checked in test_registry) run SHORT steps to keep the suite fast
LONG = 100_000
SHORT = 10_000


def stats_of(data: Any, **extra: Any) -> TensorStats:
    """Honest statistics of a small array (what the hook would compute)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return _stats_of(np.asarray(data, dtype=np.float64), **extra)


def _stats_of(a: Any, **extra: Any) -> TensorStats:
    finite = a[np.isfinite(a)]
    f = finite if finite.size else np.zeros(1)
    pct = {str(q): float(np.percentile(f, q)) for q in (5, 50, 95)} if finite.size else None
    base: dict[str, Any] = dict(
        numel=int(a.size),
        mean=float(np.mean(a)) if a.size else 0.0,
        std=float(np.std(a)) if a.size else 0.0,
        min=float(np.min(a)) if a.size else 0.0,
        max=float(np.max(a)) if a.size else 0.0,
        mean_abs=float(np.mean(np.abs(a))) if a.size else 0.0,
        l1=float(np.sum(np.abs(a))),
        l2=float(np.sqrt(np.sum(a * a))),
        zeros=int(np.sum(a == 0)),
        nan=int(np.sum(np.isnan(a))),
        inf=int(np.sum(np.isinf(a))),
        percentiles=pct,
        samples=int(a.shape[0]) if a.ndim else None,
    )
    base.update(extra)
    return TensorStats(**base)


def tensor(
    data: Any, collections: Sequence[str] = ("default",), *, dtype: str = "float32", **extra: Any
) -> TensorRecord:
    a = np.asarray(data)
    return TensorRecord(
        collections=list(collections), dtype=dtype, shape=list(a.shape), stats=stats_of(a, **extra)
    )


def scalar(value: float, collections: Sequence[str] = ("losses",)) -> ScalarRecord:
    return ScalarRecord(value=value, collections=list(collections))


@dataclass
class M:
    """One mode's content at a step."""

    mode_step: int | None = None
    scalars: Mapping[str, float | ScalarRecord] | None = None
    tensors: Mapping[str, TensorRecord] | None = None


def header(
    step: int, modes: Mapping[str, M], *, worker: int = 0, world_size: int = 1, wall_time: float | None = None
) -> StepHeader:
    records = {}
    for mode, m in modes.items():
        scalars = {
            name: (v if isinstance(v, ScalarRecord) else scalar(v)) for name, v in (m.scalars or {}).items()
        }
        records[mode] = ModeRecord(
            mode_step=step if m.mode_step is None else m.mode_step,
            scalars=scalars,
            tensors=dict(m.tensors or {}),
        )
    return StepHeader(
        job=JOB,
        step=step,
        worker=worker,
        world_size=world_size,
        wall_time=float(step) if wall_time is None else wall_time,
        modes=records,
    )


def step_data(
    step: int,
    *,
    train: float | None = None,
    eval: float | None = None,
    tensors: Mapping[str, TensorRecord] | None = None,
    mode: str = "TRAIN",
    mode_step: int | None = None,
    workers: Sequence[Mapping[str, TensorRecord]] | None = None,
) -> StepData:
    """A step with optional TRAIN/EVAL losses (scalar ``loss`` in ``losses``) and tensors.

    ``workers``: per-worker tensors (overrides ``tensors``) for multi-worker steps.
    """
    per_worker = list(workers) if workers is not None else [tensors or {}]
    headers = []
    for w, tens in enumerate(per_worker):
        modes: dict[str, M] = {}
        if train is not None:
            modes["TRAIN"] = M(mode_step, {"loss": train})
        if eval is not None:
            modes["EVAL"] = M(mode_step, {"loss": eval})
        if tens:
            modes.setdefault(mode, M(mode_step))
            modes[mode].tensors = tens
        if not modes:
            modes[mode] = M(mode_step)
        headers.append(header(step, modes, worker=w, world_size=len(per_worker)))
    return StepData.from_headers(headers)


def losses(pairs: Iterable[tuple[int, float]], mode: str = "TRAIN") -> list[StepData]:
    return [step_data(s, **{mode.lower(): v}) for s, v in pairs]


@dataclass
class Outcome:
    fired_at: int | None
    findings: list[Finding]
    state: RuleState
    steps_run: int

    @property
    def finding(self) -> Finding:
        assert self.findings, "the rule did not fire"
        return self.findings[0]


def run(rule: Rule[Any, Any], steps: Iterable[StepData], *, finish: bool = True) -> Outcome:
    """Drive a rule like the evaluator: in order, stop at the first finding, then finish."""
    state = rule.initial_state()
    n = 0
    for sd in steps:
        n += 1
        state, found = rule.update(state, sd)
        # the state must survive the DynamoDB round trip at every step
        state = rule.load_state(json.loads(json.dumps(rule.dump_state(state))))
        if found:
            return Outcome(found[0].step, found, state, n)
    found = rule.finish(state) if finish else []
    return Outcome(found[0].step if found else None, found, state, n)


def make(name: str, **params: Any) -> Rule[Any, Any]:
    """A rule built from SageMaker-style string parameters, through the real parser."""
    entry = {
        "RuleConfigurationName": name,
        "RuleParameters": {"rule_to_invoke": name, **{k: str(v) for k, v in params.items()}},
    }
    [configured] = parse_rule_configurations([entry])
    assert configured.error is None, configured.error
    assert configured.rule is not None
    return configured.rule


def config_error(name: str, **params: Any) -> str:
    entry = {
        "RuleConfigurationName": name,
        "RuleParameters": {"rule_to_invoke": name, **{k: str(v) for k, v in params.items()}},
    }
    [configured] = parse_rule_configurations([entry])
    assert configured.rule is None
    assert configured.error is not None
    return configured.error


def state_bytes(rule: Rule[Any, Any], state: RuleState) -> int:
    return len(json.dumps(rule.dump_state(state)))


def fast_step(step: int, modes: Mapping[str, M], workers: int = 1) -> StepData:
    """Like ``header`` but without validation: for the 100,000-step state-size tests."""
    headers = []
    for w in range(workers):
        records = {
            mode: ModeRecord.model_construct(
                mode_step=step if m.mode_step is None else m.mode_step,
                scalars={
                    n: (
                        v
                        if isinstance(v, ScalarRecord)
                        else ScalarRecord.model_construct(value=v, collections=["losses"])
                    )
                    for n, v in (m.scalars or {}).items()
                },
                tensors=dict(m.tensors or {}),
            )
            for mode, m in modes.items()
        }
        headers.append(
            StepHeader.model_construct(
                format="trainguard.step/1",
                job=JOB,
                step=step,
                worker=w,
                world_size=workers,
                prev_step=None,
                wall_time=float(step),
                modes=records,
            )
        )
    return StepData(step, tuple(headers), float(step))


def long_run(rule: Rule[Any, Any], steps: Iterable[StepData]) -> tuple[RuleState, int | None]:
    """Feed many steps (no stop at a finding), round-tripping the state every 1000 steps."""
    state = rule.initial_state()
    fired: int | None = None
    for i, sd in enumerate(steps):
        state, found = rule.update(state, sd)
        if found and fired is None:
            fired = found[0].step
        if i % 1000 == 0:
            state = rule.load_state(json.loads(json.dumps(rule.dump_state(state))))
    return state, fired


def repeat(template: StepData, n: int, start: int = 0) -> Iterable[StepData]:
    """``template``'s content at steps start..start+n-1 (cheap: headers are shared)."""
    for s in range(start, start + n):
        yield StepData(s, template.workers, float(s))
