"""The XGBoost report (CreateXgboostReport): built from what the callback saved."""

from __future__ import annotations

import re

import numpy as np
import pytest

xgb = pytest.importorskip("xgboost")

import trainguard  # noqa: E402
from trainguard.format import layout  # noqa: E402
from trainguard.hook.xgboost_support import TrainguardCallback  # noqa: E402
from trainguard.report import generate_report  # noqa: E402
from trainguard.report.xgboost import (  # noqa: E402
    build_xgboost_report,
    generate_xgboost_report,
    has_xgboost_data,
    load_xgboost_data,
)

ALL = ["metrics", "losses", "feature_importance", "trees", "labels", "predictions"]


def train(path, params, x, y, xv, yv, rounds=15):
    hook = trainguard.Hook(
        path,
        save_config=trainguard.SaveConfig(save_interval=1),
        include_collections=ALL,
        stop_check_interval_s=0,
    )
    dtrain, dval = xgb.DMatrix(x, label=y), xgb.DMatrix(xv, label=yv)
    evals = [(dtrain, "train"), (dval, "validation")]
    with hook:
        callback = TrainguardCallback(
            hook, dtrain=dtrain, evals=evals, importance_types=("weight", "gain"), max_samples=200
        )
        xgb.train(
            {"nthread": 1, "max_depth": 3, **params},
            dtrain,
            rounds,
            evals=evals,
            verbose_eval=False,
            callbacks=[callback],
        )


@pytest.fixture(scope="module")
def classification_job(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("xgbreport") / "clf"
    x, xv = rng.normal(size=(400, 6)), rng.normal(size=(200, 6))
    y, yv = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(float), (xv[:, 0] + 0.5 * xv[:, 1] > 0).astype(float)
    train(path, {"objective": "binary:logistic", "eval_metric": ["logloss", "error"]}, x, y, xv, yv)
    return path


@pytest.fixture(scope="module")
def regression_job(tmp_path_factory):
    rng = np.random.default_rng(1)
    path = tmp_path_factory.mktemp("xgbreport") / "reg"
    x, xv = rng.normal(size=(400, 5)), rng.normal(size=(200, 5))
    y, yv = x.sum(axis=1), xv.sum(axis=1)
    train(path, {"objective": "reg:squarederror"}, x, y, xv, yv)
    return path


def test_classification_report(classification_job):
    where = generate_xgboost_report(classification_job)
    assert where.endswith("report/xgboost-report.html")
    html = (classification_job / "report" / "xgboost-report.html").read_text()
    for section in ("summary", "metrics", "feature-importance", "tree-depth", "predictions"):
        assert f'<section id="{section}">' in html
    assert (
        "<svg" in html
        and "<script" not in html.lower()
        and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    )
    assert "Confusion matrix" in html and "class='confusion'" in html
    assert "classification (2 classes)" in html
    assert ">logloss</h3>" in html and ">error</h3>" in html
    assert "boosting rounds" in html and "<b>15</b>" in html
    assert "Residuals" not in html
    # the confusion matrix counts every saved validation row once
    data = load_xgboost_data(trainguard.create_trial(classification_job))
    val = next(o for o in data.outputs if o.name == "validation")
    assert val.labels.size == 200 and data.outputs[0].classes == [0, 1]
    table = html[html.index("<table class='confusion'><tr><th>validation") :]
    table = table[: table.index("</table>")]
    assert re.search(r"<th>predictions</th>.*<td class='num'>200</td></tr>$", table)
    assert set(data.metrics) == {"logloss", "error"}
    assert set(data.metrics["logloss"]) == {"train", "validation"}
    assert len(data.metrics["logloss"]["train"]) == 15
    assert set(data.importance) == {"weight", "gain"}
    assert data.importance["weight"][0] == 14 and data.importance["weight"][1][0][0] in ("f0", "f1")
    assert len(data.depth) == 15 and all(1 <= d <= 3 for _, d, _ in data.depth)


def test_regression_report(regression_job, tmp_path):
    out = tmp_path / "elsewhere" / "x.html"
    assert generate_xgboost_report(regression_job, out) == str(out)
    html = out.read_text()
    assert "regression" in html and "Residuals" in html and "RMSE" in html
    assert "Confusion matrix" not in html
    assert ">rmse</h3>" in html
    assert not (regression_job / "report" / "xgboost-report.html").exists()


def test_generate_report_writes_both(regression_job):
    where = generate_report(regression_job)
    assert where.endswith(layout.REPORT)
    assert (regression_job / "report" / "profiler-report.html").is_file()
    assert (regression_job / "report" / "xgboost-report.html").is_file()


def test_generate_report_skips_other_jobs(tmp_path):
    path = tmp_path / "plain"
    with trainguard.Hook(path, include_collections=["losses"], stop_check_interval_s=0) as hook:
        for step in range(3):
            hook.save_scalar("loss", 1.0 / (step + 1), step=step, collections=["losses"])
    generate_report(path)
    assert (path / "report" / "profiler-report.html").is_file()
    assert not (path / "report" / "xgboost-report.html").exists()
    assert not has_xgboost_data(None, ["loss"]) and has_xgboost_data(None, ["feature_importance/weight/f0"])


def test_report_keys_are_report_objects():
    for key in (layout.REPORT, layout.XGBOOST_REPORT):
        assert layout.parse_relative("job", key).kind is layout.ObjectKind.REPORT


def test_empty_data_renders():
    from trainguard.report.xgboost import XgboostData

    html = build_xgboost_report(XgboostData(job="empty"))
    assert "No metrics saved" in html and "No trees saved" in html and "<html" in html
