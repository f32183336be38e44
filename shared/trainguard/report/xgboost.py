"""The XGBoost report (SageMaker's CreateXgboostReport): one self-contained HTML page.

``generate_xgboost_report("s3://bucket/jobs/my-job")`` writes ``report/xgboost-report.html``
next to the job's data (a local folder works the same way), from what
:class:`~trainguard.hook.xgboost_support.TrainguardCallback` saved:

* job summary: boosting rounds, data sets, metrics, features, frameworks, the task (inferred
  from the saved labels and predictions);
* metrics over boosting rounds: one line plot per metric, one line per data set
  (``<set>-<metric>`` scalars), with a table of last/min/max values;
* feature importance: the last saved round's top 20 features, one bar chart per type
  (``feature_importance/<type>/<feature>``);
* tree depth over rounds: the depth of the trees added at each saved round (``trees/Depth``)
  and ``log2`` of the largest node id (``trees/Node``, what TreeDepth judges);
* labels and predictions (``<set>/labels``, ``<set>/predictions``, last saved round): class
  counts and a confusion matrix for classification, label/prediction/residual histograms
  for regression.

Reads the job through :func:`trainguard.create_trial`; never imports xgboost.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

import numpy as np

from trainguard.format.documents import Manifest, TensorRecord
from trainguard.format.layout import XGBOOST_REPORT
from trainguard.report.html import CSS
from trainguard.report.svg import Series, bar_plot, histogram_plot, line_plot
from trainguard.trial import TensorUnavailable, Trial, create_trial
from trainguard.version import __version__

IMPORTANCE_PREFIX = "feature_importance/"
TOP_FEATURES = 20
#: at most this many distinct integer classes make a confusion matrix
MAX_CLASSES = 30
_BINS = 30
BOLD = " style='font-weight:600;background:#eef6ee'"

__all__ = [
    "XGBOOST_REPORT",
    "XgboostData",
    "build_xgboost_report",
    "generate_xgboost_report",
    "has_xgboost_data",
    "load_xgboost_data",
]


@dataclass
class SetOutputs:
    """Labels and predictions of one data set at one saved round."""

    name: str
    step: int
    labels: np.ndarray[Any, Any]
    predictions: np.ndarray[Any, Any]

    @property
    def classes(self) -> list[int] | None:
        """The classes when labels and predictions are few distinct integers (classification)."""
        both = np.concatenate([self.labels.ravel(), self.predictions.ravel()])
        if both.size == 0 or not np.all(np.isfinite(both)) or not np.all(both == np.rint(both)):
            return None
        values = np.unique(both.astype(np.int64))
        return [int(v) for v in values] if values.size <= MAX_CLASSES else None


@dataclass
class XgboostData:
    """Everything :func:`build_xgboost_report` renders."""

    job: str
    source: str = ""
    frameworks: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    #: metric -> data set -> [(round, value)]
    metrics: dict[str, dict[str, list[tuple[int, float]]]] = field(default_factory=dict)
    #: importance type -> (round, [(feature, share)] largest first)
    importance: dict[str, tuple[int, list[tuple[str, float]]]] = field(default_factory=dict)
    #: [(round, max depth from trees/Depth or nan, log2 of the largest node id or nan)]
    depth: list[tuple[int, float, float]] = field(default_factory=list)
    outputs: list[SetOutputs] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def has_xgboost_data(manifest: Manifest | None, scalar_names: Sequence[str] = ()) -> bool:
    """Whether a job holds XGBoost data: the manifest names xgboost, or importances were saved."""
    if manifest is not None and any(f.name.lower() == "xgboost" for f in manifest.frameworks):
        return True
    return any(name.startswith(IMPORTANCE_PREFIX) for name in scalar_names)


# ---------------------------------------------------------------------- loading
def _split_metric(name: str) -> tuple[str, str]:
    """``validation-logloss`` -> (``validation``, ``logloss``); a name without '-' is its own set."""
    data_set, sep, metric = name.partition("-")
    return (data_set, metric) if sep and data_set and metric else ("", name)


def _depth_series(trial: Trial) -> list[tuple[int, float, float]]:
    rows: dict[int, list[float]] = {}
    for column, name in ((0, "trees/Depth"), (1, "trees/Node")):
        tensor = trial.tensor(name)
        for step in tensor.steps():
            try:
                stats = tensor.stats(step)
            except TensorUnavailable:
                continue
            if stats.max is None:
                continue  # the hook did not compute it: no point rather than a made-up one
            value = float(stats.max)
            if column == 1:
                value = math.log2(value) if value > 0 else 0.0
            rows.setdefault(step, [math.nan, math.nan])[column] = value
    return [(step, v[0], v[1]) for step, v in sorted(rows.items())]


def _values(trial: Trial, name: str, step: int) -> np.ndarray[Any, Any] | None:
    tensor = trial.tensor(name)
    record = tensor.record(step)
    stats = record.stats if isinstance(record, TensorRecord) else None
    if stats is not None and stats.values is not None:
        array = np.asarray(stats.values, dtype=np.float64)
        shape = tuple(record.shape) if isinstance(record, TensorRecord) else ()
        return array.reshape(shape) if shape and math.prod(shape) == array.size else array
    try:
        value = tensor.value(step)
    except TensorUnavailable:
        return None
    return np.asarray(value, dtype=np.float64)


def _outputs(trial: Trial, notes: list[str]) -> list[SetOutputs]:
    out: list[SetOutputs] = []
    for label_name in trial.tensor_names(regex=r".+/labels$"):
        set_name = label_name[: -len("/labels")]
        pred_name = f"{set_name}/predictions"
        common = sorted(set(trial.tensor(label_name).steps()) & set(trial.tensor(pred_name).steps()))
        if not common:
            continue
        step = common[-1]
        labels, preds = _values(trial, label_name, step), _values(trial, pred_name, step)
        if labels is None or preds is None:
            notes.append(f"{set_name}: labels/predictions at round {step} hold statistics only")
            continue
        if labels.size != preds.size:
            notes.append(
                f"{set_name}: {labels.size} labels but {preds.size} predictions at round {step} "
                "(raw multi-output predictions?); not compared"
            )
            continue
        out.append(SetOutputs(set_name, step, labels.ravel(), preds.ravel()))
    return out


def load_xgboost_data(trial: Trial, job: str | None = None) -> XgboostData:
    """Read what the XGBoost callback saved in a job."""
    manifest = trial.manifest
    name = job or (manifest.job if manifest is not None else trial.path.rstrip("/").rsplit("/", 1)[-1])
    data = XgboostData(job=name, source=trial.path)
    if manifest is not None:
        data.frameworks = [f"{f.name} {f.version}" if f.version else f.name for f in manifest.frameworks]
    data.steps = trial.steps()
    for scalar, points in trial.scalars(collection="metrics").items():
        if scalar.startswith(IMPORTANCE_PREFIX):
            continue
        data_set, metric = _split_metric(scalar)
        data.metrics.setdefault(metric, {})[data_set] = sorted(points.items())
    latest: dict[str, tuple[int, dict[str, float]]] = {}
    for scalar, points in trial.scalars().items():
        if not scalar.startswith(IMPORTANCE_PREFIX) or not points:
            continue
        kind, sep, feature = scalar[len(IMPORTANCE_PREFIX) :].partition("/")
        if not sep:
            continue
        step = max(points)
        seen_step, features = latest.get(kind, (-1, {}))
        if step > seen_step:
            seen_step, features = step, {}
        if step == seen_step:
            features[feature] = points[step]
        latest[kind] = (seen_step, features)
    for kind, (step, features) in sorted(latest.items()):
        ranked = sorted(features.items(), key=lambda kv: (-kv[1], kv[0]))
        data.importance[kind] = (step, ranked)
    data.depth = _depth_series(trial)
    data.outputs = _outputs(trial, data.notes)
    return data


# ---------------------------------------------------------------------- rendering
def _num(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.6g}"


def _card(label: str, value: str) -> str:
    return f"<div class='card'><b>{escape(value)}</b><span>{escape(label)}</span></div>"


def _task(data: XgboostData) -> str:
    if not data.outputs:
        return "unknown"
    classes = data.outputs[0].classes
    return f"classification ({len(classes)} classes)" if classes is not None else "regression"


def _summary(data: XgboostData) -> str:
    rounds = (max(data.steps) + 1) if data.steps else 0
    sets = sorted({s for per_set in data.metrics.values() for s in per_set if s})
    features = max((len(f) for _, f in data.importance.values()), default=0)
    cards = [
        ("boosting rounds", str(rounds)),
        ("data sets", ", ".join(sets) or "-"),
        ("metrics", ", ".join(data.metrics) or "-"),
        ("features", str(features) if features else "-"),
        ("task (inferred)", _task(data)),
    ]
    parts = ['<section id="summary"><h2>Job summary</h2><div class="cards">']
    parts += [_card(k, v) for k, v in cards]
    parts.append("</div>")
    frameworks = ", ".join(data.frameworks) or "not recorded"
    parts.append(
        f"<p class='small'>Frameworks: {escape(frameworks)}. Rounds with saved data: {len(data.steps)}. "
        "The objective is not saved by the hook; the task is inferred from the saved labels and "
        "predictions.</p></section>"
    )
    return "".join(parts)


def _metrics_section(data: XgboostData) -> str:
    parts = ['<section id="metrics"><h2>Metrics over boosting rounds</h2>']
    if not data.metrics:
        parts.append("<p class='na'>No metrics saved (collection <code>metrics</code>).</p></section>")
        return "".join(parts)
    rows: list[str] = []
    for metric, per_set in data.metrics.items():
        ordered = sorted(per_set.items(), key=lambda kv: (kv[0] != "train", kv[0]))
        series = [
            Series(label=s or metric, xs=[p[0] for p in pts], ys=[p[1] for p in pts]) for s, pts in ordered
        ]
        parts.append(f"<h3>{escape(metric)}</h3>")
        parts.append(line_plot(series, title=metric, x_label="boosting round", y_label=metric))
        for s, pts in ordered:
            ys = [p[1] for p in pts]
            rows.append(
                f"<tr><td>{escape(s or '-')}</td><td>{escape(metric)}</td><td class='num'>{len(ys)}</td>"
                f"<td class='num'>{_num(ys[-1])}</td><td class='num'>{_num(min(ys))}</td>"
                f"<td class='num'>{_num(max(ys))}</td></tr>"
            )
    parts.append(
        "<table><tr><th>data set</th><th>metric</th><th>rounds</th><th>last</th><th>min</th>"
        "<th>max</th></tr>" + "".join(rows) + "</table></section>"
    )
    return "".join(parts)


def _importance_section(data: XgboostData) -> str:
    parts = ['<section id="feature-importance"><h2>Feature importance</h2>']
    if not data.importance:
        parts.append(
            "<p class='na'>No feature importance saved (collection <code>feature_importance</code>, "
            "tree boosters only).</p></section>"
        )
        return "".join(parts)
    for kind, (step, ranked) in data.importance.items():
        top = ranked[:TOP_FEATURES]
        used = sum(1 for _, v in ranked if v > 0)
        parts.append(
            f"<h3>{escape(kind)}</h3><p class='small'>Round {step}: top {len(top)} of {len(ranked)} "
            f"features ({used} used by the model); each value is the feature's share of the total.</p>"
        )
        parts.append(
            bar_plot(
                [f for f, _ in top],
                [v for _, v in top],
                title=f"feature importance ({kind}), round {step}",
                value_label="share of total importance",
            )
        )
    parts.append("</section>")
    return "".join(parts)


def _depth_section(data: XgboostData) -> str:
    parts = ['<section id="tree-depth"><h2>Tree depth over rounds</h2>']
    if not data.depth:
        parts.append("<p class='na'>No trees saved (collection <code>trees</code>).</p></section>")
        return "".join(parts)
    series = []
    for column, label in ((1, "max depth (trees/Depth)"), (2, "log2 of the largest node id (trees/Node)")):
        pts = [(row[0], row[column]) for row in data.depth if math.isfinite(row[column])]
        if pts:
            series.append(Series(label=label, xs=[p[0] for p in pts], ys=[p[1] for p in pts]))
    parts.append(
        line_plot(
            series, title="depth of the trees added per saved round", x_label="boosting round", y_min=0.0
        )
    )
    parts.append(
        "<p class='small'>TreeDepth judges log2 of the largest node id; trees/Depth is the exact depth "
        "from the tree dump.</p></section>"
    )
    return "".join(parts)


def _confusion(out: SetOutputs, classes: list[int]) -> str:
    index = {c: i for i, c in enumerate(classes)}
    matrix = np.zeros((len(classes), len(classes)), dtype=np.int64)
    for label, pred in zip(out.labels.astype(np.int64), out.predictions.astype(np.int64), strict=False):
        matrix[index[int(label)], index[int(pred)]] += 1
    total = int(matrix.sum())
    accuracy = float(np.trace(matrix)) / total if total else math.nan
    head = "".join(f"<th>pred {c}</th>" for c in classes)
    rows = []
    for i, c in enumerate(classes):
        cells = "".join(
            f"<td class='num'{BOLD if i == j else ''}>{int(matrix[i, j])}</td>" for j in range(len(classes))
        )
        rows.append(f"<tr><th>true {c}</th>{cells}<td class='num'>{int(matrix[i].sum())}</td></tr>")
    counts = "".join(f"<td class='num'>{int(matrix[:, j].sum())}</td>" for j in range(len(classes)))
    return (
        f"<p class='small'>Accuracy {_num(accuracy)} on {total} rows.</p>"
        f"<table class='confusion'><tr><th>{escape(out.name)}</th>{head}<th>labels</th></tr>"
        + "".join(rows)
        + f"<tr><th>predictions</th>{counts}<td class='num'>{total}</td></tr></table>"
    )


def _hist(values: np.ndarray[Any, Any], title: str, x_label: str) -> str:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return histogram_plot([], [], title=title)
    counts, edges = np.histogram(finite, bins=_BINS)
    return histogram_plot(
        [float(e) for e in edges], [int(c) for c in counts], title=title, x_label=x_label, height=200
    )


def _outputs_section(data: XgboostData) -> str:
    parts = ['<section id="predictions"><h2>Labels and predictions</h2>']
    if not data.outputs:
        parts.append(
            "<p class='na'>No labels and predictions saved (collections <code>labels</code>, "
            "<code>predictions</code>; pass <code>dtrain=</code>/<code>evals=</code> to the callback)."
            "</p></section>"
        )
        return "".join(parts)
    for out in data.outputs:
        classes = out.classes
        parts.append(f"<h3>{escape(out.name)} (round {out.step}, {out.labels.size} rows)</h3>")
        if classes is not None:
            labels = out.labels.astype(np.int64)
            preds = out.predictions.astype(np.int64)
            rows = "".join(
                f"<tr><td>{c}</td><td class='num'>{int(np.sum(labels == c))}</td>"
                f"<td class='num'>{int(np.sum(preds == c))}</td></tr>"
                for c in classes
            )
            parts.append(
                "<h3>Label and prediction distribution</h3><table><tr><th>class</th><th>labels</th>"
                f"<th>predictions</th></tr>{rows}</table>"
            )
            parts.append("<h3>Confusion matrix</h3>" + _confusion(out, classes))
        else:
            residuals = out.predictions - out.labels
            finite = residuals[np.isfinite(residuals)]
            rmse = float(np.sqrt(np.mean(finite**2))) if finite.size else math.nan
            mae = float(np.mean(np.abs(finite))) if finite.size else math.nan
            parts.append("<h3>Label and prediction distribution</h3>")
            parts.append(_hist(out.labels, f"{out.name}: labels", "label"))
            parts.append(_hist(out.predictions, f"{out.name}: predictions", "prediction"))
            parts.append(
                f"<h3>Residuals</h3><p class='small'>prediction - label: RMSE {_num(rmse)}, "
                f"MAE {_num(mae)}, mean {_num(float(np.mean(finite)) if finite.size else math.nan)}.</p>"
            )
            parts.append(_hist(residuals, f"{out.name}: residuals", "prediction - label"))
    parts.append("</section>")
    return "".join(parts)


def build_xgboost_report(trial: Trial | XgboostData, *, generated_at: float | None = None) -> str:
    """Render the XGBoost report of a job (a trial, or data already loaded) as one HTML page."""
    data = trial if isinstance(trial, XgboostData) else load_xgboost_data(trial)
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(generated_at or time.time()))
    notes = ""
    if data.notes:
        notes = (
            '<section id="data"><h2>Data notes</h2><ul>'
            + "".join(f"<li>{escape(n)}</li>" for n in data.notes[:50])
            + "</ul></section>"
        )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>XGBoost report: {escape(data.job)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>XGBoost report: {escape(data.job)}</h1>"
        f"<div class='meta'>Generated {escape(generated)} by trainguard {escape(__version__)}"
        f"{' from ' + escape(data.source) if data.source else ''}</div>"
        + _summary(data)
        + _metrics_section(data)
        + _importance_section(data)
        + _depth_section(data)
        + _outputs_section(data)
        + notes
        + "</main></body></html>"
    )


def generate_xgboost_report(
    path_or_s3: str | os.PathLike[str], out_path: str | os.PathLike[str] | None = None, store: Any = None
) -> str:
    """Build the XGBoost report of a job folder and write it.

    Written to ``out_path`` (a local file) when given, else to ``report/xgboost-report.html``
    under the job folder (uploaded with content type text/html for ``s3://``). Returns where.
    """
    from trainguard.hook.storage import open_store
    from trainguard.report import write_html

    url = os.fspath(path_or_s3)
    store = store or open_store(url)
    html = build_xgboost_report(create_trial(url, store=store)).encode()
    return write_html(store, url, XGBOOST_REPORT, html, out_path)
