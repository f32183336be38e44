"""The profiler report: data loading (local and S3), sections, self-containment, hostile input."""

from __future__ import annotations

import re
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from sysjob import write_demo_job
from trainguard.format import layout
from trainguard.format.system import dump_system_batch
from trainguard.report import build_report, generate_report, load_job_data, main_report
from trainguard.report.data import JobData
from trainguard.report.svg import Series, line_plot, nice_ticks, reduce_points


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return write_demo_job(tmp_path_factory.mktemp("jobs"))


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory) -> Path:
    return write_demo_job(tmp_path_factory.mktemp("small"), "small-job", total_s=240.0)


@pytest.fixture(scope="module")
def demo_html(demo: Path) -> str:
    return build_report(load_job_data(demo))


def test_load_job_data_reads_batches_and_scalars(demo: Path) -> None:
    data = load_job_data(demo)
    assert data.job == "demo-job" and data.manifest is not None
    assert len(data.batches) == 240 and not data.problems
    assert {b.worker for b in data.batches} == {0, 1}
    assert set(data.scalars) == {"loss", "loss (EVAL)", "accuracy (EVAL)"}
    steps = [s for s, _ in data.scalars["loss"]]
    assert steps == sorted(steps) and steps[0] == 0 and len(steps) > 250


def test_report_has_every_section(demo_html: str) -> None:
    for section in ("summary", "rules", "usage", "utilization", "steps", "scalars"):
        assert f'id="{section}"' in demo_html
    for text in ("Initialization", "Training loop", "Finalization", "p95", "p99", "GPU 1 memory used"):
        assert text in demo_html
    assert demo_html.count("<svg") >= 11  # phases, 3 per node, 2 per step mode, 1 per scalar


def test_report_is_self_contained(demo_html: str) -> None:
    assert "<script" not in demo_html.lower()
    assert not re.search(r"\b(src|href)\s*=", demo_html)
    assert "@import" not in demo_html and "url(" not in demo_html
    urls = set(re.findall(r"https?://[^\"' )<]+", demo_html))
    assert urls <= {"http://www.w3.org/2000/svg"}


def test_rules_summary_shows_what_fired_and_what_to_do(demo_html: str) -> None:
    rules = demo_html[demo_html.index('id="rules"') : demo_html.index('id="usage"')]
    for name in ("StepOutlier", "LoadBalancing", "GPUMemoryIncrease", "Dataloader", "LowGPUUtilization"):
        row = rules[rules.index(f"<b>{name}</b>") :].split("</tr>")[0]
        assert "Issues found" in row and "step " in row, name
    for name in ("CPUBottleneck", "IOBottleneck", "MaxInitializationTime"):
        row = rules[rules.index(f"<b>{name}</b>") :].split("</tr>")[0]
        assert "No issues" in row, name
    assert "num_workers" in rules  # the Dataloader advice


def test_generate_report_writes_next_to_the_job(small_demo: Path, tmp_path: Path) -> None:
    where = generate_report(small_demo)
    assert where == f"{small_demo}/{layout.REPORT}" and Path(where).read_text().startswith("<!DOCTYPE html>")
    out = tmp_path / "elsewhere" / "r.html"
    assert generate_report(small_demo, out) == str(out) and out.stat().st_size > 10_000


def test_main_report_cli(small_demo: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "cli.html"
    assert main_report([str(small_demo), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert main_report(["ftp://nowhere/job"]) == 2
    assert "trainguard report: ftp://nowhere/job: unsupported URL scheme" in capsys.readouterr().err


def test_generate_report_on_s3(small_demo: Path) -> None:
    demo = small_demo
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="tg-bucket")
        for path in demo.rglob("*"):
            if path.is_file() and "report" not in path.parts:
                s3.put_object(
                    Bucket="tg-bucket", Key=f"jobs/small-job/{path.relative_to(demo)}", Body=path.read_bytes()
                )
        where = generate_report("s3://tg-bucket/jobs/small-job")
        assert where == "s3://tg-bucket/jobs/small-job/report/profiler-report.html"
        obj = s3.get_object(Bucket="tg-bucket", Key="jobs/small-job/report/profiler-report.html")
        assert obj["ContentType"].startswith("text/html")
        body = obj["Body"].read().decode()
        assert "Profiler report: small-job" in body and "Dataloader" in body and 'id="scalars"' in body


def test_empty_and_hostile_job_folders_still_render(tmp_path: Path) -> None:
    folder = tmp_path / "empty-job"
    folder.mkdir()
    html = build_report(load_job_data(folder))
    assert (
        "No system samples were recorded" in html
        and "No step timings" in html
        and "no readable manifest" in html
    )
    bad = tmp_path / "bad-job"
    (bad / "system" / "worker-00000").mkdir(parents=True)
    (bad / "system" / "worker-00000" / "000000000000.json").write_bytes(
        b'{"format": "trainguard.system/1", "x": 1}'
    )
    (bad / "system" / "worker-00000" / "000000000001.json").write_bytes(b"\x00" * 100)
    (bad / "system" / "junk.txt").write_text("hello")
    data = load_job_data(bad)
    assert len(data.problems) == 3 and data.batches == []
    assert "Data notes" in build_report(data)


def test_gpu_absent_job_says_its_gpu_rules_could_not_judge(tmp_path: Path) -> None:
    from sysbatches import series

    folder = tmp_path / "cpu-job"
    for b in series(400, gpu=lambda i: None):
        path = folder / layout.system_key(b.worker, b.seq)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(dump_system_batch(b))
    html = build_report(load_job_data(folder))
    assert "0 GPUs (absent: not measured)" in html
    rules = html[html.index('id="rules"') : html.index('id="usage"')]
    assert rules.count("no GPU data was recorded") >= 5 and "Not applicable" not in rules
    assert rules.count("<span class='err'>Error</span>") >= 5


def test_scalars_given_directly_are_plotted() -> None:
    html = build_report(JobData(job="j", scalars={"loss": [(0, 1.0), (1, float("nan")), (2, 0.5)]}))
    assert "1 non-finite values not drawn" in html


def test_svg_helpers() -> None:
    assert nice_ticks(0, 100) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(0.5, 0.5) != []
    xs = list(range(100_000))
    reduced = reduce_points(xs, [float(x % 7) for x in xs])
    assert len(reduced) <= 1600 and max(y for _, y in reduced) == 6.0
    svg = line_plot([Series("<b>", [0, 1], [1, 2])], title="t & u")
    assert "&lt;b&gt;" in svg and "t &amp; u" in svg and svg.startswith("<svg")
    assert "no data" in line_plot([Series("x", [], [])])
