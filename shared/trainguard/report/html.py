"""The profiler report: one self-contained HTML page (inline CSS and SVG; no scripts, no assets).

Sections, as in SageMaker's profiling report: job summary (initialisation, training loop,
finalisation), the model rules (what fired, at which step, what to do), the profiler rules
summary (likewise), system usage per node (p50/p95/p99/min/max), CPU/GPU utilisation and
memory over time, I/O and network, step durations (statistics, histogram, outliers), and
training scalars over steps (clipped axes marked, the first non-finite value marked).

The profiler rules summary comes from running :class:`~trainguard.rules.profiler.ProfilerReport`
over the batches with the job's own parameters (its ProfilerReport and standalone profiler
rules), so the report and the service judge the same data the same way; the model rules come
from the engine's replay (:mod:`trainguard.report.data`). Each rule's description is written
with the parameter values it ran with.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

import numpy as np

from trainguard.format.system import SystemBatch, SystemSample
from trainguard.report.data import JobData, ModelRuleResult
from trainguard.report.svg import PALETTE, Series, histogram_plot, line_plot, phase_bar
from trainguard.report.text import fill, ordinal
from trainguard.rules.base import RuleConfig
from trainguard.rules.profiler import ProfilerReport, RuleResult, evaluate_per_worker
from trainguard.rules.profiler.profiler_report import SUB_RULES, ProfilerReportConfig
from trainguard.rules.profiler.step_outlier import WARMUP_STEPS
from trainguard.version import __version__

MAX_SCALAR_PLOTS = 12
MAX_NODE_PLOTS = 16

CSS = (
    "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;"
    "background:#f6f7f9;color:#1d2330}"
    "main{max-width:960px;margin:0 auto;padding:24px} h1{font-size:24px;margin:0 0 4px}"
    "h2{font-size:18px;margin:28px 0 8px;border-bottom:2px solid #dde1e7;padding-bottom:4px}"
    "h3{font-size:15px;margin:18px 0 6px} .meta{color:#5b6475;font-size:13px}"
    "section{background:#fff;border-radius:8px;padding:8px 18px 16px;margin-top:16px;"
    "box-shadow:0 1px 2px rgba(0,0,0,.06)}"
    "table{border-collapse:collapse;width:100%;font-size:13px;margin:6px 0}"
    "th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #e6e8ec;vertical-align:top}"
    "th{background:#f0f2f5} td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}"
    "td.nowrap{white-space:nowrap}"
    ".ok{color:#1a7f37;font-weight:600} .issue{color:#c62828;font-weight:600} .na{color:#6b7280}"
    ".err{color:#b45309;font-weight:600} .cards{display:flex;gap:12px;flex-wrap:wrap}"
    ".card{flex:1;min-width:150px;background:#f0f4fa;border-radius:6px;padding:8px 12px}"
    ".card b{display:block;font-size:20px} .card span{font-size:12px;color:#5b6475}"
    "svg{max-width:100%;height:auto} .small{font-size:12px;color:#5b6475}"
)


@dataclass
class NodeSeries:
    """One node's samples as arrays (time in seconds since the job start)."""

    name: str
    t: np.ndarray[Any, Any]
    cpu: np.ndarray[Any, Any]
    mem: np.ndarray[Any, Any]
    iowait: np.ndarray[Any, Any]
    rates: dict[str, np.ndarray[Any, Any]]
    gpu_util: dict[int, np.ndarray[Any, Any]] = field(default_factory=dict)
    gpu_mem: dict[int, np.ndarray[Any, Any]] = field(default_factory=dict)
    gpu_t: dict[int, np.ndarray[Any, Any]] = field(default_factory=dict)
    cores: int = 0


@dataclass
class Timeline:
    start: float | None
    first_step: float | None
    last_step_end: float | None
    end: float | None

    def phases(self) -> tuple[float, float, float] | None:
        if self.start is None or self.end is None:
            return None
        if self.first_step is None or self.last_step_end is None:
            return (self.end - self.start, 0.0, 0.0)
        return (
            max(0.0, self.first_step - self.start),
            max(0.0, self.last_step_end - self.first_step),
            max(0.0, self.end - self.last_step_end),
        )


def ordered_batches(batches: Sequence[SystemBatch]) -> list[SystemBatch]:
    """Each worker's batches in seq order, workers interleaved by time (duplicates dropped)."""
    seen: set[tuple[int, int]] = set()
    unique = []
    for b in sorted(batches, key=lambda b: (b.worker, b.seq)):
        if (b.worker, b.seq) not in seen:
            seen.add((b.worker, b.seq))
            unique.append(b)
    by_worker: dict[int, list[SystemBatch]] = {}
    for b in unique:
        by_worker.setdefault(b.worker, []).append(b)
    # merge keeps each worker's seq order even if its wall clock stepped back
    out = list(heapq.merge(*by_worker.values(), key=lambda b: b.end_time))
    return out


def timeline(batches: Sequence[SystemBatch]) -> Timeline:
    starts = [b.init.hook_start for b in batches if b.init is not None]
    starts += [s.t for b in batches[:1] for s in b.samples[:1]]
    starts += [b.start_time for b in batches]
    first = [e.start for b in batches for e in b.steps]
    first += [b.init.first_step_start for b in batches if b.init and b.init.first_step_start is not None]
    ends = [e.end for b in batches for e in b.steps]
    end = [b.end_time for b in batches]
    return Timeline(
        min(starts) if starts else None,
        min(first) if first else None,
        max(ends) if ends else None,
        max(end) if end else None,
    )


def node_series(batches: Sequence[SystemBatch], t0: float) -> list[NodeSeries]:
    """Samples per node (host). When several workers of a host sampled it, the lowest rank's are used."""
    owner: dict[str, int] = {}
    samples: dict[str, list[SystemSample]] = {}
    for b in sorted(batches, key=lambda b: (b.worker, b.seq)):
        if not b.samples:
            continue
        name = b.host or f"worker-{b.worker}"
        if owner.setdefault(name, b.worker) != b.worker:
            continue
        samples.setdefault(name, []).extend(b.samples)
    out = []
    for name, items in sorted(samples.items()):
        items.sort(key=lambda s: s.t)
        t = np.array([s.t - t0 for s in items])
        node = NodeSeries(
            name=name,
            t=t,
            cpu=np.array([s.cpu_total for s in items]),
            mem=np.array([s.mem_used_percent for s in items]),
            iowait=np.array([s.iowait_percent for s in items]),
            rates={
                "disk read": np.array([s.disk_read_bytes_s for s in items]),
                "disk write": np.array([s.disk_write_bytes_s for s in items]),
                "network rx": np.array([s.net_rx_bytes_s for s in items]),
                "network tx": np.array([s.net_tx_bytes_s for s in items]),
            },
            cores=max((len(s.cpu_percent) for s in items), default=0),
        )
        gpu_points: dict[int, list[tuple[float, float, float]]] = {}
        for s in items:
            for g in s.gpus or ():
                gpu_points.setdefault(g.index, []).append((s.t - t0, g.util_percent, g.mem_used_percent))
        for index, pts in sorted(gpu_points.items()):
            arr = np.array(pts)
            node.gpu_t[index], node.gpu_util[index], node.gpu_mem[index] = arr[:, 0], arr[:, 1], arr[:, 2]
        out.append(node)
    return out


def _stats(values: np.ndarray[Any, Any]) -> list[float]:
    if values.size == 0:
        return []
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return [float(p50), float(p95), float(p99), float(values.min()), float(values.max())]


def _num(value: float, unit: str = "") -> str:
    if not math.isfinite(value):
        return str(value)
    if unit == "B/s":
        for scale, name in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
            if abs(value) >= scale:
                return f"{value / scale:.2f} {name}"
        return f"{value:.0f} B/s"
    if unit == "s":
        if value >= 120:
            return f"{value / 60:.1f} min"
        return f"{value:.3g} s" if value < 10 else f"{value:.1f} s"
    return f"{value:.1f}{unit}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def _stamp(t: float | None) -> str:
    if t is None:
        return "n/a"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _summary_section(data: JobData, tl: Timeline, batches: Sequence[SystemBatch], steps: int) -> str:
    """What the job recorded; what it did not is left out, with one line saying why."""
    phases = tl.phases()
    workers = sorted({b.worker for b in batches} | set(data.ranks))
    hosts = sorted({b.host or f"worker-{b.worker}" for b in batches})
    interval = batches[0].interval_s if batches else None
    world = data.manifest.world_size if data.manifest is not None else None
    rules = [r.name for r in data.model_rules or []]
    cards: list[tuple[str, str]] = []
    if phases:
        cards += [
            ("Total", _duration(None if tl.start is None or tl.end is None else tl.end - tl.start)),
            ("Initialization", _duration(phases[0])),
            ("Training loop", _duration(phases[1])),
            ("Finalization", _duration(phases[2])),
        ]
    if steps:
        cards.append(("Steps timed", f"{steps:,}"))
    if data.steps_saved:
        cards.append(("Steps saved", f"{data.steps_saved:,}"))
    if workers or world:
        cards.append(("Workers", f"{world or len(workers):,}"))
    if rules:
        cards.append(("Model rules", f"{len(rules)}"))
    parts = ['<section id="summary"><h2>Job summary</h2>']
    if cards:
        parts.append('<div class="cards">')
        parts += [f"<div class='card'><b>{escape(v)}</b><span>{escape(k)}</span></div>" for k, v in cards]
        parts.append("</div>")
    if phases:
        parts.append(
            phase_bar(
                [
                    ("initialization", phases[0], "#9467bd"),
                    ("training loop", phases[1], "#2ca02c"),
                    ("finalization", phases[2], "#ff7f0e"),
                ]
            )
        )
    rows = [("Job", data.job)]
    if data.manifest is not None:
        frameworks = ", ".join(f"{f.name} {f.version or ''}".strip() for f in data.manifest.frameworks)
        if frameworks:
            rows.append(("Frameworks", frameworks))
    if workers or world:
        listed = ", ".join(map(str, workers[:16])) + ("…" if len(workers) > 16 else "")
        count = world if world is not None else len(workers)
        rows.append(("Workers", f"{count} (ranks {listed})" if listed else f"{count}"))
    if data.step_range is not None:
        first, last = data.step_range
        rows.append(("Steps saved", f"{data.steps_saved:,} (steps {first} to {last})"))
    if data.modes:
        rows.append(("Modes", ", ".join(data.modes)))
    if rules:
        defaults = data.manifest is not None and data.manifest.rules is None
        rows.append(("Model rules", ", ".join(rules) + (" (the service's defaults)" if defaults else "")))
    if batches:
        rows.append(("Start (hook started)", _stamp(tl.start)))
        if tl.first_step is not None:
            rows += [
                ("First step started", _stamp(tl.first_step)),
                ("Last step ended", _stamp(tl.last_step_end)),
            ]
        rows += [
            ("End (last data)", _stamp(tl.end)),
            ("Nodes", ", ".join(hosts[:16]) + ("…" if len(hosts) > 16 else "")),
            ("Sampling interval", "n/a" if interval is None else f"{interval:g} s"),
            ("System batches read", f"{len(batches):,}"),
        ]
    parts.append("<table>")
    parts += [f"<tr><th style='width:220px'>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows]
    parts.append("</table>")
    missing = _not_recorded(data, batches, tl)
    if missing:
        parts.append(f"<p class='small na'>{escape(missing)}</p>")
    parts.append("</section>")
    return "".join(parts)


def _not_recorded(data: JobData, batches: Sequence[SystemBatch], tl: Timeline) -> str:
    """One line: what the summary leaves out, and why."""
    if not batches:
        what = "Not recorded: start and end times, the phases, nodes and system usage"
        if data.manifest is not None and data.manifest.system_interval_s is not None:
            return f"{what}; profiling was on, but no system batch could be read (see Data notes)."
        return f"{what}: the job ran without profiling (trainguard.Hook(..., profiler=True) records them)."
    if tl.first_step is None:
        return "Not recorded: step timings (no training step was timed while profiling)."
    return ""


def profiler_config(data: JobData) -> tuple[ProfilerReportConfig, str | None]:
    """The job's profiler parameters: its ProfilerReport's, and those of profiler rules it
    configured on their own (``StepOutlier`` with ``n_outliers=5`` judges with 5 here too)."""
    rules = data.manifest.rules if data.manifest is not None else None
    if not rules:
        return ProfilerReportConfig(), None
    from trainguard.rules.config import parse_rule_configurations

    names = {cls.name for cls in SUB_RULES}
    params: dict[str, str] = {}
    for configured in parse_rule_configurations(rules):
        if configured.rule_name == ProfilerReport.name:
            params.update(configured.parameters)
        elif configured.rule_name in names:
            params.update({f"{configured.rule_name}_{k}": v for k, v in configured.parameters.items()})
    try:
        return ProfilerReportConfig.model_validate(params), None
    except ValueError as exc:
        first = str(exc).splitlines()[:3]
        return (
            ProfilerReportConfig(),
            f"the job's profiler parameters are invalid ({' '.join(first)}); defaults used",
        )


def _when(
    step: int | None, mode: str | None, mode_step: int | None, at: float | None, t0: float | None
) -> str:
    if step is None:
        return "—"
    text = f"step {step}"
    if mode is not None and mode_step is not None:
        text += f"<br><span class='small'>{escape(mode)} step {mode_step}</span>"
    if at is not None and t0 is not None:
        text += f"<br><span class='small'>after {_duration(max(0.0, at - t0))}</span>"
    return text


def _model_rules_section(data: JobData, t0: float | None) -> str:
    rows = data.model_rules
    parts = ['<section id="model-rules"><h2>Model rules</h2>']
    if rows is None:
        parts.append(
            "<p class='na'>The job's model rules were not evaluated for this report (see Data notes).</p>"
            "</section>"
        )
        return "".join(parts)
    if not rows:
        parts.append("<p class='na'>The job configured no model rules.</p></section>")
        return "".join(parts)
    fired = [r for r in rows if r.status == "IssuesFound"]
    parts.append(
        f"<p class='meta'>{len(fired)} of {len(rows)} model rules found issues. Evaluated with the job's "
        "own rule configuration over its step objects, with the code the service runs "
        "(<code>trainguard replay</code>); steps are global steps (EVAL passes advance them too).</p>"
    )
    parts.append(
        "<table><tr><th>Rule</th><th>Status</th><th>When</th><th>Details</th><th>What to do</th></tr>"
    )
    # findings in the order they fired, then the others in the job's configuration order
    order = {"IssuesFound": 0, "Error": 1, "Stopped": 2, "InProgress": 3, "NoIssuesFound": 4}
    for r in sorted(rows, key=lambda r: (order.get(r.status, 5), _fired_at(r.step, r.wall_time))):
        parts.append(_model_row(r, t0))
    parts.append("</table></section>")
    return "".join(parts)


def _fired_at(step: int | None, when: float | None) -> tuple[float, float]:
    """Sort key of a finding: its step, then its time (0 for rows that did not fire: kept in order)."""
    return (float(step) if step is not None else 0.0, when if when is not None else 0.0)


def _model_row(r: ModelRuleResult, t0: float | None) -> str:
    label = r.name if r.name == r.rule else f"{r.name} ({r.rule})"
    details = r.details
    if details.startswith("RuleEvaluationConditionMet") and ". " in details:
        details = details.split(". ", 1)[1]  # SageMaker's preamble repeats the name and the step
    if r.status == "IssuesFound":
        status, advice = "<span class='issue'>Issues found</span>", escape(r.advice or "—")
    elif r.status == "Error":
        status = "<span class='err'>Error</span>"
        advice = "Fix the rule's configuration or the data named; the other rules go on."
    elif r.status == "Stopped":
        status, advice = "<span class='na'>Stopped</span>", "—"
        details = f"{details} Checks: {r.summary}" if r.summary else details
    elif r.status == "InProgress":
        status, advice = "<span class='na'>In progress</span>", "—"
        details = f"The job has not ended (no end marker from every worker). Checks: {r.summary}"
    else:
        status, advice = "<span class='ok'>No issues</span>", "—"
    return (
        f"<tr><td><b>{escape(label)}</b></td><td class='nowrap'>{status}</td>"
        f"<td class='nowrap'>{_when(r.step, r.mode, r.mode_step, r.wall_time, t0)}</td>"
        f"<td>{escape(details) or '—'}</td><td>{advice}</td></tr>"
    )


def _how_to_judge(rule: str, profiled: bool) -> str:
    """What makes a rule able to judge the next job."""
    if not profiled:
        return "Profile the job: trainguard.Hook(..., profiler=True)."
    if rule == "Dataloader":
        return (
            "For the worker-count check, iterate a torch DataLoader through hook.timed_loader(loader): "
            "its num_workers is what this rule reads."
        )
    return "It judges GPU metrics: on a host with GPUs, NVML must be readable (pynvml importable)."


def _rules_section(
    results: list[RuleResult],
    t0: float | None,
    configs: dict[str, RuleConfig] | None = None,
    data_wait: float | None = None,
    batches: Sequence[SystemBatch] = (),
) -> str:
    fired = [r for r in results if r.status == "IssuesFound"]
    unjudged = [r for r in results if r.unjudged]
    parts = ['<section id="rules"><h2>Profiler rules</h2>']
    could_not = f" {len(unjudged)} could not judge the job (Error, with the reason)." if unjudged else ""
    parts.append(
        f"<p class='meta'>{len(fired)} of {len(results)} profiler rules found issues.{could_not} Evaluated "
        "like the trainguard service does, with the job's parameters: each worker's system batches in "
        "order, one state per worker; a rule found issues if it did for any worker.</p>"
    )
    if not batches:
        parts.append(
            "<p class='err'>The job recorded no system data: it ran without profiling "
            "(trainguard.Hook(..., profiler=True) records it), so no profiler rule could judge it.</p>"
        )
    parts.append(
        "<table><tr><th>Rule</th><th>Status</th><th>When</th><th>Details</th><th>What to do</th></tr>"
    )
    # findings in the order they fired, then errors, then the rest in the rules' own order
    rank = {"IssuesFound": 0, "Error": 1}
    order = sorted(
        results,
        key=lambda r: (
            rank.get(r.status, 2),
            _fired_at(r.finding.step, r.finding.time) if r.finding is not None else (0.0, 0.0),
        ),
    )
    for r in order:
        config = (configs or {}).get(r.name)
        summary = fill(r.summary, config)
        if r.status == "IssuesFound" and r.finding is not None:
            status = "<span class='issue'>Issues found</span>"
            when = _when(r.finding.step, None, None, r.finding.time, t0)
            details = escape(r.finding.message)
            advice = escape(r.advice)
        elif r.error:
            status, when = "<span class='err'>Error</span>", "—"
            details = escape(r.error)
            advice = "A bug in the rule or data it cannot read; the other rules went on."
        elif r.unjudged:
            status, when = "<span class='err'>Error</span>", "—"
            details = escape(r.unjudged.replace(": not applicable: ", ": ") + ".")
            advice = escape(_how_to_judge(r.name, bool(batches)))
            if r.name == "Dataloader" and data_wait is not None:
                # its num_workers check could not run; the data waits it measured are shown below
                details += escape(
                    f" The data waits were measured: {data_wait:.1f}% of step time was spent "
                    "waiting for data (Step durations)."
                )
        else:
            note = r.notes.get("note")
            status = "<span class='na'>Not applicable</span>" if note else "<span class='ok'>No issues</span>"
            when, advice = "—", "—"
            details = escape(note) if note else "Fires when: " + escape(summary) + "."
            if r.name == "OverallSystemUsage":  # never fires: its numbers are the usage tables below
                status = "<span class='na'>Summary</span>"
                details = escape(summary[:1].upper() + summary[1:]) + "; see the tables below."
        parts.append(
            f"<tr><td><b>{escape(r.name)}</b></td><td class='nowrap'>{status}</td>"
            f"<td class='nowrap'>{when}</td><td>{details}</td><td>{advice}</td></tr>"
        )
    parts.append("</table></section>")
    return "".join(parts)


def _usage_section(nodes: list[NodeSeries]) -> str:
    parts = ['<section id="usage"><h2>System usage statistics</h2>']
    if not nodes:
        parts.append("<p class='na'>No system samples were recorded.</p></section>")
        return "".join(parts)
    for node in nodes[:MAX_NODE_PLOTS]:
        parts.append(
            f"<h3>Node {escape(node.name)}</h3><p class='small'>{node.t.size:,} samples, "
            f"{node.cores} CPU cores, "
            f"{len(node.gpu_util)} GPUs{' (absent: not measured)' if not node.gpu_util else ''}</p>"
        )
        parts.append(
            "<table><tr><th>Metric</th><th class='num'>p50</th><th class='num'>p95</th>"
            "<th class='num'>p99</th><th class='num'>min</th><th class='num'>max</th></tr>"
        )
        rows: list[tuple[str, np.ndarray[Any, Any], str]] = [("CPU utilisation", node.cpu, "%")]
        for index, util in node.gpu_util.items():
            rows.append((f"GPU {index} utilisation", util, "%"))
        rows.append(("Memory used", node.mem, "%"))
        for index, mem in node.gpu_mem.items():
            rows.append((f"GPU {index} memory used", mem, "%"))
        rows.append(("I/O wait", node.iowait, "%"))
        rows += [(name.capitalize(), values, "B/s") for name, values in node.rates.items()]
        for label, values, unit in rows:
            stats = _stats(values)
            cells = "".join(f"<td class='num'>{_num(v, unit)}</td>" for v in stats)
            parts.append(f"<tr><td>{escape(label)}</td>{cells}</tr>")
        parts.append("</table>")
    parts.append("</section>")
    return "".join(parts)


def _timeseries_section(nodes: list[NodeSeries]) -> str:
    parts = ['<section id="utilization"><h2>CPU and GPU utilisation over time</h2>']
    if not nodes:
        parts.append("<p class='na'>No system samples were recorded.</p></section>")
        return "".join(parts)
    for node in nodes[:MAX_NODE_PLOTS]:
        minutes = node.t / 60.0
        util = [Series("CPU total", minutes, node.cpu, PALETTE[0])]
        util += [
            Series(f"GPU {i}", node.gpu_t[i] / 60.0, u, PALETTE[(i + 1) % len(PALETTE)])
            for i, u in node.gpu_util.items()
        ]
        parts.append(
            line_plot(
                util,
                title=f"{node.name}: utilisation",
                x_label="minutes since start",
                x_min=0,
                y_label="%",
                y_min=0,
                y_max=100,
            )
        )
        mem = [
            Series("memory", minutes, node.mem, PALETTE[0]),
            Series("I/O wait", minutes, node.iowait, "#7f7f7f"),
        ]
        mem += [
            Series(f"GPU {i} memory", node.gpu_t[i] / 60.0, m, PALETTE[(i + 1) % len(PALETTE)])
            for i, m in node.gpu_mem.items()
        ]
        parts.append(
            line_plot(
                mem,
                title=f"{node.name}: memory and I/O wait",
                x_label="minutes since start",
                x_min=0,
                y_label="%",
                y_min=0,
                y_max=100,
            )
        )
        rates = [
            Series(name, minutes, values / 1e6, PALETTE[(k + 2) % len(PALETTE)])
            for k, (name, values) in enumerate(node.rates.items())
        ]
        parts.append(
            line_plot(
                rates,
                title=f"{node.name}: disk and network",
                x_label="minutes since start",
                x_min=0,
                y_label="MB/s",
                y_min=0,
                height=220,
            )
        )
    parts.append("</section>")
    return "".join(parts)


def _steps_section(batches: Sequence[SystemBatch], t0: float) -> tuple[str, int]:
    # (worker, step, duration, start since t0, data wait) per mode
    by_mode: dict[str, list[tuple[int, int, float, float, float]]] = {}
    for b in batches:
        for e in b.steps:
            by_mode.setdefault(e.mode, []).append(
                (b.worker, e.step, e.end - e.start, e.start - t0, e.data_wait_s)
            )
    total = sum(len(v) for v in by_mode.values())
    parts = ['<section id="steps"><h2>Step durations</h2>']
    if not by_mode:
        parts.append("<p class='na'>No step timings were recorded.</p></section>")
        return "".join(parts), 0
    parts.append(
        "<table><tr><th>Mode</th><th class='num'>Steps (all workers)</th><th class='num'>mean</th>"
        "<th class='num'>p50</th><th class='num'>p95</th><th class='num'>p99</th><th class='num'>max</th>"
        "<th class='num'>Outliers (&gt; mean + 3·std)</th><th class='num'>Waiting for data</th></tr>"
    )
    plots = []
    for mode in ("TRAIN", "EVAL", "PREDICT", "GLOBAL"):
        events = by_mode.get(mode)
        if not events:
            continue
        d = np.array([e[2] for e in events])
        wait = float(sum(e[4] for e in events))
        mean, std = float(d.mean()), float(d.std())
        limit = mean + 3 * std
        outliers = sorted((e for e in events if e[2] > limit), key=lambda e: -e[2])
        p50, p95, p99 = (float(x) for x in np.percentile(d, [50, 95, 99]))
        busy = wait + float(d.sum())
        share = 100.0 * wait / busy if busy > 0 else 0.0
        parts.append(
            f"<tr><td>{mode}</td><td class='num'>{d.size:,}</td><td class='num'>{_num(mean, 's')}</td>"
            f"<td class='num'>{_num(p50, 's')}</td><td class='num'>{_num(p95, 's')}</td>"
            f"<td class='num'>{_num(p99, 's')}</td><td class='num'>{_num(float(d.max()), 's')}</td>"
            f"<td class='num'>{len(outliers)}</td><td class='num'>{share:.1f}%</td></tr>"
        )
        lo = float(d.min())
        hi = min(float(d.max()), max(p99 * 1.25, limit * 1.1))
        hi = max(hi, lo + 1e-6)
        overflow = int((d > hi).sum())
        counts, edges = np.histogram(d[d <= hi], bins=40, range=(lo, hi))
        plots.append(
            histogram_plot(
                [float(x) for x in edges],
                [int(c) for c in counts],
                title=f"{mode} step duration histogram (red: above mean + 3·std = {_num(limit, 's')})",
                x_label="seconds",
                highlight_from=limit,
                overflow=overflow,
            )
        )
        workers = sorted({e[0] for e in events})
        lines = []
        for k, w in enumerate(workers[:8]):
            mine = sorted((e for e in events if e[0] == w), key=lambda e: e[1])
            lines.append(Series(f"worker {w}", [e[1] for e in mine], [e[2] for e in mine], PALETTE[k % 8]))
        first, last = min(e[1] for e in events), max(e[1] for e in events)
        lines.append(Series("mean + 3·std", [first, last], [limit, limit], "#000000"))
        plots.append(
            line_plot(
                lines,
                title=f"{mode} step duration by step" + (" (first 8 workers)" if len(workers) > 8 else ""),
                x_label="step",
                y_label="seconds",
                y_min=0,
                height=220,
            )
        )
        if outliers:
            rows = "".join(
                f"<tr><td class='num'>{e[1]}</td><td class='num'>{e[0]}</td>"
                f"<td class='num'>{_num(e[2], 's')}</td>"
                f"<td class='num'>{_duration(e[3])}</td><td class='num'>{_num(e[4], 's')}</td></tr>"
                for e in outliers[:10]
            )
            plots.append(
                f"<h3>{mode}: slowest outlier steps</h3><table><tr><th class='num'>Step</th>"
                "<th class='num'>Worker</th><th class='num'>Duration</th><th class='num'>Started after</th>"
                f"<th class='num'>Waited for data</th></tr>{rows}</table>"
            )
    parts.append("</table>")
    parts.append(
        f"<p class='small'>StepOutlier judges each step against the steps before it, from the "
        f"{ordinal(WARMUP_STEPS + 1)} on; the table above uses the whole job's mean and std.</p>"
    )
    parts += plots
    parts.append("</section>")
    return "".join(parts), total


def _scalars_section(scalars: dict[str, list[tuple[int, float]]]) -> str:
    parts = ['<section id="scalars"><h2>Training scalars</h2>']
    if not scalars:
        parts.append("<p class='na'>No scalars (losses, metrics) were saved by the hook.</p></section>")
        return "".join(parts)
    # one plot per scalar name, its modes overlaid ("loss" and "loss (EVAL)")
    groups: dict[str, list[str]] = {}
    for name in scalars:
        groups.setdefault(name.split(" (", 1)[0], []).append(name)
    bases = sorted(groups, key=lambda n: ("loss" not in n.lower(), n))
    for base in bases[:MAX_SCALAR_PLOTS]:
        lines, bad, sparse = [], 0, False
        onset: tuple[int, float] | None = None  # the first non-finite value: (step, value)
        for k, name in enumerate(groups[base]):
            points = [(s, v) for s, v in scalars[name] if math.isfinite(v)]
            bad += len(scalars[name]) - len(points)
            first_bad = next(((s, v) for s, v in scalars[name] if not math.isfinite(v)), None)
            if first_bad is not None and (onset is None or first_bad[0] < onset[0]):
                onset = first_bad
            sparse = sparse or len(points) < 60
            lines.append(
                Series(name, [p[0] for p in points], [p[1] for p in points], PALETTE[k % len(PALETTE)])
            )
        title = base + (f" ({bad} non-finite values not drawn)" if bad else "")
        markers = [] if onset is None else [(float(onset[0]), f"{onset[1]} from step {onset[0]}")]
        last_step = max((s for name in groups[base] for s, _ in scalars[name]), default=None)
        parts.append(
            line_plot(
                lines,
                title=title,
                x_label="step",
                height=220,
                step_lines=sparse,
                clip=True,
                markers=markers,
                x_max=None if last_step is None else float(last_step),
                shade_from=None if onset is None else float(onset[0]),
            )
        )
    if len(bases) > MAX_SCALAR_PLOTS:
        parts.append(f"<p class='small'>{len(bases) - MAX_SCALAR_PLOTS} more scalars not shown.</p>")
    parts.append("</section>")
    return "".join(parts)


def data_wait_share(batches: Sequence[SystemBatch]) -> float | None:
    """Percent of step time (all modes) spent waiting for data; None without step timings."""
    wait = sum(e.data_wait_s for b in batches for e in b.steps)
    busy = wait + sum(e.end - e.start for b in batches for e in b.steps)
    return 100.0 * wait / busy if busy > 0 else None


def _job_start(data: JobData) -> float | None:
    return data.manifest.created if data.manifest is not None else None


def build_report(job_data: JobData, *, generated_at: float | None = None) -> str:
    """Render the profiler report for a job as one self-contained HTML document."""
    batches = ordered_batches(job_data.batches)
    config, config_note = profiler_config(job_data)
    results = evaluate_per_worker(batches, config)
    configs: dict[str, RuleConfig] = {n: r.config for n, r in ProfilerReport(config).rules.items()}
    tl = timeline(batches)
    t0 = tl.start if tl.start is not None else 0.0
    nodes = node_series(batches, t0)
    steps_html, step_count = _steps_section(batches, t0)
    generated = _stamp(time.time() if generated_at is None else generated_at)
    notes = "".join(
        f"<li>{escape(n)}</li>" for n in [*job_data.notes, *([config_note] if config_note else [])]
    )
    problems = "".join(f"<li>{escape(p)}</li>" for p in job_data.problems[:50])
    extra = ""
    if notes or problems:
        extra = '<section id="data"><h2>Data notes</h2><ul>' + notes + problems + "</ul>"
        if len(job_data.problems) > 50:
            extra += f"<p class='small'>{len(job_data.problems) - 50} more unreadable objects.</p>"
        extra += "</section>"
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>Profiler report: {escape(job_data.job)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>Profiler report: {escape(job_data.job)}</h1>"
        f"<div class='meta'>Generated {escape(generated)} by trainguard {escape(__version__)}"
        f"{' from ' + escape(job_data.source) if job_data.source else ''}</div>"
        + _summary_section(job_data, tl, batches, step_count)
        + _model_rules_section(job_data, tl.start if tl.start is not None else _job_start(job_data))
        + _rules_section(results, tl.start, configs, data_wait_share(batches), batches)
        + _usage_section(nodes)
        + _timeseries_section(nodes)
        + steps_html
        + _scalars_section(job_data.scalars)
        + extra
        + "</main></body></html>"
    )
