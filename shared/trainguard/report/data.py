"""Read what the report needs from a job folder (local or ``s3://``): system batches, scalars,
and what the job's model rules found.

System batches come from ``system/worker-*/*.json``; training scalars (losses, metrics) from
the step objects' headers through :mod:`trainguard.trial`. Reads are bounded: at most
:data:`MAX_SYSTEM_OBJECTS` system objects and :data:`MAX_STEP_OBJECTS` step headers (evenly
spaced when the job has more; the report says so). An object that cannot be read or parsed
is listed in ``problems`` and skipped, never fatal.

The model rules (ExplodingTensor, LossNotDecreasing, ...): when the caller has the service's
final statuses (the report function has them in the job-finished event), those are shown;
otherwise the job's own configuration is judged by ``trainguard replay``'s engine over the
job's step objects, the code the service runs. Either way the report says which rule fired,
at which step, and what to do. Without statuses, a job with more than
:data:`MAX_REPLAY_OBJECTS` step objects is not re-evaluated (the report says so and points
to ``trainguard status``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from trainguard.format import layout
from trainguard.format.documents import Manifest, parse_document, read_bounded_document
from trainguard.format.system import MAX_SYSTEM_BYTES, SystemBatch, parse_system_batch

MAX_SYSTEM_OBJECTS = 50_000
MAX_STEP_OBJECTS = 5_000
#: at most this many step objects (or segments) are re-evaluated for the model rules
MAX_REPLAY_OBJECTS = 5_000
#: concurrent reads (S3 GETs are latency-bound; the stores are thread-safe)
FETCH_THREADS = 16
MODES = ("TRAIN", "EVAL", "PREDICT", "GLOBAL")


@dataclass
class ModelRuleResult:
    """One model rule of the job, as replay left it."""

    name: str
    rule: str
    status: str
    details: str
    summary: str = ""
    advice: str = ""
    step: int | None = None
    mode: str | None = None
    mode_step: int | None = None
    tensor: str | None = None
    #: wall time of the step the rule fired at (seconds since the epoch), when known
    wall_time: float | None = None


@dataclass
class JobData:
    """Everything :func:`trainguard.report.build_report` renders."""

    job: str
    batches: list[SystemBatch] = field(default_factory=list)
    #: name -> [(step, value)] in step order; non-TRAIN modes are named "<name> (EVAL)"
    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    manifest: Manifest | None = None
    source: str = ""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the job's model rules; None when they were not evaluated (``notes`` says why)
    model_rules: list[ModelRuleResult] | None = None
    #: what the step objects recorded: how many steps, the first and last, the workers
    #: (ranks) that wrote them and the modes they were in
    steps_saved: int = 0
    step_range: tuple[int, int] | None = None
    ranks: list[int] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)


def _job_name(path: str) -> str:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    try:
        return layout.validate_job_name(name)
    except layout.LayoutError:
        return "job"


def load_job_data(
    path_or_s3: str | os.PathLike[str], store: Any = None, rule_statuses: Sequence[Any] | None = None
) -> JobData:
    """Load a job folder: ``s3://bucket/prefix/<job>`` or a local directory.

    ``rule_statuses``: the service's final ``DebugRuleEvaluationStatuses`` of the job (entries
    with ``RuleConfigurationName``, ``RuleEvaluationStatus``, ``StatusDetails``); given, the
    model rules are shown from them instead of being evaluated again.
    """
    from trainguard.hook.storage import open_store  # the one storage adapter (boto3 only for s3://)

    url = os.fspath(path_or_s3)
    store = store or open_store(url)
    data = JobData(job=_job_name(url), source=url)
    try:
        raw = read_bounded_document(store, layout.MANIFEST)
        data.manifest = parse_document(Manifest, raw)
        data.job = data.manifest.job
    except Exception as exc:
        data.notes.append(f"no readable manifest ({type(exc).__name__})")
    _load_system(store, data)
    _load_scalars(url, store, data)
    if rule_statuses is not None:
        _model_rules_from_statuses(store, data, rule_statuses)
    else:
        _load_model_rules(store, data)
    return data


def _load_system(store: Any, data: JobData) -> None:
    keys = []
    for key in store.list("system/"):
        try:
            ref = layout.parse_relative("job", key)
        except layout.LayoutError:
            data.problems.append(f"{key}: not a system object key")
            continue
        if ref.kind == layout.ObjectKind.SYSTEM and ref.worker is not None and ref.seq is not None:
            keys.append((ref.worker, ref.seq, key))
    keys.sort()
    if len(keys) > MAX_SYSTEM_OBJECTS:
        data.notes.append(f"{len(keys)} system objects; the report reads the first {MAX_SYSTEM_OBJECTS}")
        keys = keys[:MAX_SYSTEM_OBJECTS]

    def fetch(key: str) -> SystemBatch | str:
        try:
            return parse_system_batch(read_bounded_document(store, key, MAX_SYSTEM_BYTES))
        except Exception as exc:
            return f"{key}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"

    with ThreadPoolExecutor(FETCH_THREADS) as pool:  # S3 GETs are latency-bound
        for result in pool.map(fetch, [key for _, _, key in keys]):
            if isinstance(result, str):
                data.problems.append(result)
            else:
                data.batches.append(result)


def _load_scalars(url: str, store: Any, data: JobData) -> None:
    try:
        from trainguard.trial import create_trial

        trial = create_trial(url, store=store)
        steps = trial.steps()
    except Exception as exc:
        data.notes.append(f"training scalars unavailable ({type(exc).__name__}: {str(exc)[:200]})")
        return
    data.steps_saved = len(steps)
    data.step_range = (steps[0], steps[-1]) if steps else None
    data.ranks = sorted(trial.ranks() or [])
    if len(steps) > MAX_STEP_OBJECTS:
        stride = len(steps) / MAX_STEP_OBJECTS
        steps = [steps[int(i * stride)] for i in range(MAX_STEP_OBJECTS)]
        data.notes.append(f"scalars shown for {MAX_STEP_OBJECTS} evenly spaced steps of {len(trial.steps())}")
    series: dict[str, list[tuple[int, float]]] = {}
    worker = min(trial.ranks() or [0])

    def fetch(step: int) -> tuple[list[str], list[tuple[str, float]]] | str:
        # only the scalars leave this function: a parsed header (MBs for big jobs) is dropped
        # here, and the trial's own cache is bounded in bytes
        try:
            header = trial.header(step, worker)
        except Exception as exc:
            return f"step {step}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
        points = []
        for mode in MODES:
            record = header.modes.get(mode)  # type: ignore[call-overload]
            if record is None:
                continue
            for name, scalar in record.scalars.items():
                points.append((name if mode == "TRAIN" else f"{name} ({mode})", scalar.value))
        return [str(m) for m in header.modes], points

    with ThreadPoolExecutor(FETCH_THREADS) as pool:
        results = list(pool.map(fetch, steps))
    seen_modes: set[str] = set()
    for step, result in zip(steps, results, strict=True):
        if isinstance(result, str):
            data.problems.append(result)
            continue
        seen_modes.update(result[0])
        for label, value in result[1]:
            series.setdefault(label, []).append((step, value))
    data.modes = [m for m in MODES if m in seen_modes] + sorted(seen_modes - set(MODES))
    data.scalars = {k: sorted(v) for k, v in sorted(series.items())}


def _load_model_rules(store: Any, data: JobData) -> None:
    """Replay the job's model rules over its step objects (bounded; never fatal)."""
    from trainguard.rules.plugins import rule_class

    try:
        objects = len(store.list("steps/")) + len(store.list("segments/"))
    except Exception as exc:
        data.notes.append(f"model rules not evaluated: cannot list the step objects ({type(exc).__name__})")
        return
    if objects == 0:
        return  # nothing but system data: there is nothing for a model rule to judge
    if objects > MAX_REPLAY_OBJECTS:
        data.notes.append(
            f"model rules not re-evaluated for the report: {objects} step objects (at most "
            f"{MAX_REPLAY_OBJECTS}); `trainguard status {data.job}` shows what the service found"
        )
        return
    try:
        result = _replay(store)
    except Exception as exc:
        data.notes.append(f"model rules not evaluated: {type(exc).__name__}: {str(exc)[:200]}")
        return
    from trainguard.report.text import fill
    from trainguard.rules.config import parse_rule_configurations

    configured = parse_rule_configurations(data.manifest.rules if data.manifest is not None else None)
    configs = {c.configuration_name: c.rule.config if c.rule is not None else None for c in configured}
    rows = []
    for record in result.state.rules:
        cls = rule_class(record.rule)
        if cls is not None and cls.kind == "profiler":
            continue  # judged over the system batches in the profiler rules summary
        rows.append(
            ModelRuleResult(
                name=record.name,
                rule=record.rule,
                status=record.status,
                details=record.details,
                summary=fill(cls.summary, configs.get(record.name)) if cls is not None else "",
                advice=cls.advice if cls is not None else "",
                step=record.step if record.status == "IssuesFound" else None,
                mode=record.mode,
                mode_step=record.mode_step,
                tensor=record.tensor,
            )
        )
    data.model_rules = rows
    _step_times(store, data)


_AT_STEP = re.compile(r"\bat step (\d+)\b")


def _model_rules_from_statuses(store: Any, data: JobData, statuses: Sequence[Any]) -> None:
    """The service's verdicts, each with its rule's description and advice from the manifest."""
    from trainguard.report.text import fill
    from trainguard.rules.config import parse_rule_configurations
    from trainguard.rules.plugins import rule_class

    configured = {
        c.configuration_name: c
        for c in parse_rule_configurations(data.manifest.rules if data.manifest is not None else None)
    }
    rows = []
    for entry in statuses:
        name = str(_field(entry, "RuleConfigurationName"))
        status = str(_field(entry, "RuleEvaluationStatus"))
        details = str(_field(entry, "StatusDetails") or "")
        rule = configured.get(name)
        cls = type(rule.rule) if rule is not None and rule.rule is not None else rule_class(name)
        if cls is not None and cls.kind == "profiler":
            continue
        found = _AT_STEP.search(details) if status == "IssuesFound" else None
        rows.append(
            ModelRuleResult(
                name=name,
                rule=rule.rule_name if rule is not None else name,
                status=status,
                details=details,
                summary=fill(cls.summary, rule.rule.config) if cls is not None and rule and rule.rule else "",
                advice=cls.advice if cls is not None else "",
                step=int(found.group(1)) if found else None,
            )
        )
    data.model_rules = rows
    _step_times(store, data)


def _field(entry: Any, name: str) -> Any:
    return entry.get(name) if isinstance(entry, dict) else getattr(entry, name, None)


def _replay(store: Any) -> Any:
    """The engine's replay over the job folder (local or S3), as ``trainguard replay`` runs it."""
    from trainguard.engine.replay import replay
    from trainguard.engine.sources import LocalJob
    from trainguard.hook.storage import LocalStore, S3Store
    from trainguard.service.s3_objects import S3Job

    if isinstance(store, S3Store):
        source: Any = S3Job(store.bucket, store.prefix, store.client)
    elif isinstance(store, LocalStore):
        source = LocalJob.open(store.root)
    else:
        raise TypeError(f"cannot replay a {type(store).__name__}")
    return replay(source)


def _step_times(store: Any, data: JobData) -> None:
    """When each finding's step was written (its header's wall time)."""
    from trainguard.trial import create_trial

    fired = [r for r in data.model_rules or [] if r.step is not None]
    if not fired:
        return
    trial = create_trial(data.source or store.url, store=store)
    for row in fired:
        assert row.step is not None
        try:
            worker = min(trial.ranks() or [0])
            row.wall_time = trial.header(row.step, worker).wall_time
        except Exception as exc:
            data.notes.append(f"step {row.step}: its time is unknown ({type(exc).__name__})")
