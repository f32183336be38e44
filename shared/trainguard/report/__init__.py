"""The profiler report: ``generate_report("s3://bucket/jobs/my-job")`` writes
``report/profiler-report.html`` next to the job's data (a local folder works the same way).

Public API::

    data = load_job_data(path_or_s3)          # system batches, scalars, manifest
    html = build_report(data)                 # one self-contained HTML page
    path = generate_report(path_or_s3)        # both, and write it (local path or s3:// URL)
    path = generate_xgboost_report(path_or_s3)  # report/xgboost-report.html (CreateXgboostReport);
                                                # generate_report also writes it for XGBoost jobs
    main_report(["runs/my-job", "--out", "report.html"])   # for ``trainguard report``
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from trainguard.format.layout import REPORT
from trainguard.report.data import JobData, load_job_data
from trainguard.report.html import build_report
from trainguard.report.xgboost import build_xgboost_report, generate_xgboost_report, has_xgboost_data

__all__ = [
    "JobData",
    "build_report",
    "build_xgboost_report",
    "generate_report",
    "generate_xgboost_report",
    "load_job_data",
    "main_report",
    "write_html",
]

log = logging.getLogger("trainguard.report")


def write_html(
    store: Any, url: str, key: str, html: bytes, out_path: str | os.PathLike[str] | None = None
) -> str:
    """Write a report: to ``out_path`` (a local file) when given, else to ``key`` under the job
    folder (uploaded with content type text/html for ``s3://``). Returns where."""
    from trainguard.hook.storage import S3Store

    if out_path is not None:
        target = os.fspath(out_path)
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        with open(target, "wb") as fh:
            fh.write(html)
        return target
    if isinstance(store, S3Store):  # a browser opening the object needs the content type
        store.client.put_object(
            Bucket=store.bucket, Key=store._key(key), Body=html, ContentType="text/html; charset=utf-8"
        )
    else:
        store.put(key, html)
    return f"{url.rstrip('/')}/{key}"


def generate_report(
    path_or_s3: str | os.PathLike[str],
    out_path: str | os.PathLike[str] | None = None,
    store: Any = None,
    rule_statuses: Any = None,
) -> str:
    """Build the report of a job folder and write it.

    Written to ``out_path`` (a local file) when given, else to ``report/profiler-report.html``
    under the job folder (uploaded with content type text/html for ``s3://``). Returns where.

    A job with XGBoost data (the manifest names xgboost, or feature importances were saved)
    also gets the XGBoost report (CreateXgboostReport): ``report/xgboost-report.html`` under
    the job folder, or ``xgboost-report.html`` beside ``out_path``. A failure there is logged
    and does not affect the profiler report.

    ``rule_statuses``: the service's final statuses of the job's rules (see
    :func:`~trainguard.report.data.load_job_data`); without them the model rules are replayed.
    """
    from trainguard.hook.storage import open_store

    url = os.fspath(path_or_s3)
    store = store or open_store(url)
    data = load_job_data(url, store=store, rule_statuses=rule_statuses)
    where = write_html(store, url, REPORT, build_report(data).encode(), out_path)
    if has_xgboost_data(data.manifest, list(data.scalars)):
        xgb_out = None
        if out_path is not None:
            xgb_out = os.path.join(
                os.path.dirname(os.path.abspath(os.fspath(out_path))), "xgboost-report.html"
            )
            if os.path.abspath(xgb_out) == os.path.abspath(where):
                xgb_out = os.path.splitext(xgb_out)[0] + "-xgboost.html"
        try:
            log.info("trainguard report: XGBoost report at %s", generate_xgboost_report(url, xgb_out, store))
        except Exception:
            log.warning("trainguard report: cannot write the XGBoost report of %s", url, exc_info=True)
    return where


def main_report(argv: Sequence[str] | None = None) -> int:
    """``trainguard report <job folder or s3://...> [--out FILE]``, with the CLI's error contract."""
    from trainguard.cli import main

    return main(["report", *(sys.argv[1:] if argv is None else argv)])
