"""The report reads right: parameters filled in, numbers under their headers, scales that survive
an outlier (what is clipped is marked), the onset of non-finite values marked, the model rules'
findings with when and what to do, and applicability that agrees with the data shown."""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from sysbatches import series
from sysjob import write_demo_job
from trainguard.format import layout
from trainguard.format.documents import Manifest, dump_document
from trainguard.format.system import dump_system_batch
from trainguard.report import build_report, load_job_data
from trainguard.report.data import JobData
from trainguard.report.svg import Series, line_plot, robust_range
from trainguard.report.text import fill, ordinal
from trainguard.rules.profiler.max_initialization_time import MaxInitializationTime
from trainguard.rules.profiler.step_outlier import StepOutlier


@pytest.fixture(scope="module")
def diverged(tmp_path_factory) -> str:
    return build_report(load_job_data(write_demo_job(tmp_path_factory.mktemp("div"), diverge=True)))


def section(html: str, name: str) -> str:
    start = html.index(f'id="{name}"')
    end = html.find("<section", start)
    return html[start : end if end > 0 else len(html)]


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


class Tables(HTMLParser):
    """Each table's header cells and its rows' cells, with their classes."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[tuple[str, str]]]] = []
        self._row: list[tuple[str, str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self._row = []
            self.tables[-1].append(self._row)
        elif tag in ("th", "td") and self._row is not None:
            self._row.append((tag, dict(attrs).get("class") or ""))


def test_rule_descriptions_have_their_parameter_values():
    assert fill(MaxInitializationTime.summary, MaxInitializationTime.Config()) == (
        "no training step has started 20 minutes after the job started"
    )
    config = StepOutlier.Config.model_validate({"n_outliers": "5", "stddev": "2.5"})
    assert fill(StepOutlier.summary, config) == "more than 5 steps longer than mean + 2.5·std"
    assert fill("over num_steps steps in mode", None) == "over num_steps steps in mode"
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "101st", "111th",
    ]  # fmt: skip


def test_no_placeholder_is_left_in_the_report(diverged):
    shown = text(diverged)
    assert "`" not in shown
    for name in ("threshold", "n_outliers", "stddev", "num_steps", "threshold_layer", "ratio_threshold"):
        # "n_outliers 10", "ratio_threshold=0.1", "(threshold: finite)" name a value; a bare name is a hole
        assert not re.search(rf"\b{name}\b(?!\s*[=:0-9])", shown), name
    assert "no training step has started 20 minutes after the job started" in shown
    assert "101st" in shown and "101th" not in shown


def test_the_job_parameters_are_the_ones_judged_and_shown(tmp_path):
    folder = tmp_path / "param-job"
    manifest = Manifest(
        job="param-job",
        created=1_000_000.0,
        hook_version="t",
        world_size=1,
        rules=[
            {
                "RuleConfigurationName": "MaxInit",
                "RuleParameters": {"rule_to_invoke": "MaxInitializationTime", "threshold": "7"},
            },
            {
                "RuleConfigurationName": "Bad",
                "RuleParameters": {"rule_to_invoke": "StepOutlier", "stddev": "-1"},
            },
        ],
    )
    (folder).mkdir()
    (folder / layout.MANIFEST).write_bytes(dump_document(manifest))
    for b in series(60, gpu=lambda i: None):
        path = folder / layout.system_key(b.worker, b.seq)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(dump_system_batch(b))
    html = build_report(load_job_data(folder))
    # one bad parameter: the defaults are used, and the report says so
    assert "the job&#x27;s profiler parameters are invalid" in html
    good = manifest.model_copy(update={"rules": manifest.rules[:1]})  # type: ignore[index]
    (folder / layout.MANIFEST).write_bytes(dump_document(good))
    assert "started 7 minutes after the job started" in text(build_report(load_job_data(folder)))


def test_numbers_stand_under_their_headers(diverged):
    parser = Tables()
    parser.feed(diverged)
    checked = 0
    for table in parser.tables:
        header = table[0] if table and all(tag == "th" for tag, _ in table[0]) else None
        if header is None:
            continue
        for row in table[1:]:
            for (_, head_class), (tag, cell_class) in zip(header, row, strict=False):
                if tag == "td" and "num" in cell_class.split():
                    assert "num" in head_class.split(), (header, row)
                    checked += 1
    assert checked > 50


def test_a_diverged_loss_is_drawn_to_scale_with_the_outlier_and_the_onset_marked(diverged):
    scalars = section(diverged, "scalars")
    assert "1 value above" in scalars and "not to scale (max 25.7M)" in scalars
    assert "inf from step 2970" in scalars
    assert scalars.count("<polygon") >= 1  # the clipped point, on the edge
    loss_svg = scalars[: scalars.index("</svg>")]
    ticks = [float(t) for t in re.findall(r'text-anchor="end">([0-9.]+)</text>', loss_svg)]
    assert ticks and max(ticks) < 10  # the axis follows the losses, not the 2.57e7


def test_robust_range_clips_only_far_outliers():
    assert robust_range([1.0, 0.9, 0.8, 0.7, 0.6]) is None
    assert robust_range([3.0, 2.0, 1.5, 1.2, 1.0, 0.9]) is None  # a steep start is data, not an outlier
    clip = robust_range([0.5, 0.45, 0.4, 0.42, 0.41, 2.57e7])
    assert clip is not None and clip.hi == 0.5 and clip.above == 1 and clip.max_value == 2.57e7
    flat = robust_range([1.0] * 20 + [1e6])
    assert flat is not None and flat.above == 1
    svg = line_plot([], title="empty", clip=True)
    assert "no data" in svg


def test_a_settling_loss_is_drawn_to_scale_and_only_a_divergence_is_clipped():
    steps = range(300)
    settling = [1.4 + 1.48 * math.exp(-s / 5) + 0.02 * math.sin(s) for s in steps]
    assert max(settling) == pytest.approx(2.88)
    assert robust_range(settling) is None  # its start (2.88) is data, not off-scale
    diverged = [*settling, 1.4e5, 3e9, 1e14, 2e19, 5e24, 1e29, 6e33]
    clip = robust_range(diverged)
    assert clip is not None and clip.hi == pytest.approx(2.88) and clip.above == 7
    # a short job whose divergence is most of its finite values: still only those clipped
    short = robust_range([2.88, 2.81, 2.74, 2.67, 2.6, 1.4e5, 3e9, 1e14, 2e19, 5e24, 1e29, 6e33])
    assert short is not None and short.hi == 2.88 and short.above == 7


def test_the_clip_note_counts_only_what_lies_beyond_the_axis():
    svg = line_plot(
        [Series("loss", list(range(307)), [*[1.4 + 1.48 * math.exp(-s / 5) for s in range(300)],
                                          1.4e5, 3e9, 1e14, 2e19, 5e24, 1e29, 6e33])],
        clip=True,
    )  # fmt: skip
    assert svg.count("<polygon") == 7 and "▲ 7 values above 2.88 not to scale (max 6e33)" in svg
    # the axis' top tick reaches the one value past the kept range: nothing is off-scale
    svg = line_plot([Series("x", list(range(11)), [0.0] * 10 + [1.0])], clip=True)
    assert "<polygon" not in svg and "not to scale" not in svg


def test_the_model_rules_say_what_fired_when_and_what_to_do(diverged):
    rules = section(diverged, "model-rules")
    row = rules[rules.index("<b>ExplodingTensor</b>") :].split("</tr>")[0]
    assert "Issues found" in row and "step 2970" in row and "TRAIN step 2970" in row and "after 19." in row
    assert "scalar loss (worker 0, TRAIN) is inf" in row
    assert "Lower the learning rate" in row  # what to do
    for name in ("LossNotDecreasing", "VanishingGradient", "DeadRelu"):
        assert f"<b>{name}</b>" in rules
    # the rows that did not fire say so, not an empty cell
    assert "<td></td>" not in rules and "<td class='nowrap'></td>" not in rules


def test_a_job_without_step_objects_has_no_model_rules_to_show(tmp_path):
    html = build_report(JobData(job="j"))
    assert "were not evaluated for this report" in section(html, "model-rules")


def test_dataloader_that_could_not_judge_says_what_the_data_waits_were(tmp_path):
    folder = tmp_path / "waits"
    for b in series(400, gpu=lambda i: None):
        b = b.model_copy(update={"steps": [e.model_copy(update={"data_wait_s": 0.05}) for e in b.steps]})
        path = folder / layout.system_key(b.worker, b.seq)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(dump_system_batch(b))
    html = build_report(load_job_data(folder))
    steps = text(section(html, "steps"))
    share = re.search(r"([0-9.]+)%\s*$", steps.split("TRAIN", 1)[1].split("StepOutlier")[0].strip())
    assert share is not None
    row = text(section(html, "rules").split("<b>Dataloader</b>")[1].split("</tr>")[0])
    assert "Error" in row and "Not applicable" not in row and "not applicable" not in row
    assert "Dataloader checked no data-loader reports" in row
    assert f"{share.group(1)}% of step time was spent waiting for data" in row
    assert "hook.timed_loader" in row  # how to make the check applicable


def test_non_finite_values_in_every_mode_are_counted(tmp_path):
    data = JobData(
        job="j",
        scalars={
            "loss": [(s, 1.0 / (1 + s)) for s in range(50)] + [(50, math.nan), (51, math.inf)],
            "loss (EVAL)": [(s, 1.2 / (1 + s)) for s in range(0, 50, 10)] + [(50, math.inf)],
        },
    )
    scalars = section(build_report(data), "scalars")
    assert "3 non-finite values not drawn" in scalars and "nan from step 50" in scalars


def test_the_report_is_still_one_self_contained_page(diverged):
    assert "<script" not in diverged.lower() and not re.search(r"\b(src|href)\s*=", diverged)
    assert Path  # (kept for the type checker)


def test_the_services_own_statuses_are_shown_when_given(tmp_path):
    folder = write_demo_job(tmp_path, "given", total_s=240.0, diverge=True)
    statuses = [
        {
            "RuleConfigurationName": "ExplodingTensor",
            "RuleEvaluationStatus": "IssuesFound",
            "StatusDetails": "RuleEvaluationConditionMet: Evaluation of the rule ExplodingTensor at step 420 "
            "resulted in the condition being met. ExplodingTensor: scalar loss is nan.",
            "LastModifiedTime": 1.0,
        },
        {"RuleConfigurationName": "Overfit", "RuleEvaluationStatus": "Stopped", "LastModifiedTime": 1.0},
        {
            "RuleConfigurationName": "StepOutlier",
            "RuleEvaluationStatus": "NoIssuesFound",
            "LastModifiedTime": 1.0,
        },
    ]
    rules = section(build_report(load_job_data(folder, rule_statuses=statuses)), "model-rules")
    assert "step 420" in rules and "scalar loss is nan" in rules and "Lower the learning rate" in rules
    assert "<b>Overfit</b>" in rules and "Stopped" in rules
    assert "<b>StepOutlier</b>" not in rules  # a profiler rule: in the profiler section


@pytest.fixture(scope="module")
def unprofiled(tmp_path_factory) -> tuple[Path, str]:
    """A job of the real hook without profiling: step objects, no system data."""
    import trainguard
    from trainguard import modes

    folder = tmp_path_factory.mktemp("unprofiled") / "plain-job"
    hook = trainguard.Hook(str(folder), include_collections=["losses"], rules=None)
    with hook:
        for step in range(40):
            hook.save_scalar("loss", 2.0 / (1 + step), step=step, collections=["losses"])
            if step % 10 == 9:
                hook.set_mode(modes.EVAL)
                hook.save_scalar("loss", 2.2 / (1 + step), step=step, collections=["losses"])
                hook.set_mode(modes.TRAIN)
    return folder, build_report(load_job_data(folder))


def test_rules_without_profiler_data_are_errors_with_their_reason_never_no_issues(unprofiled):
    rules = section(unprofiled[1], "rules")
    assert "No issues" not in rules and "Not applicable" not in rules
    for name in ("StepOutlier", "MaxInitializationTime", "CPUBottleneck", "Dataloader"):
        row = text(rules.split(f"<b>{name}</b>")[1].split("</tr>")[0])
        assert "Error" in row and "no system" in row, row
        assert "profiler=True" in row  # what to do
    assert "it ran without profiling" in text(rules)


def test_the_summary_shows_what_the_job_recorded_and_says_what_it_did_not(unprofiled):
    summary = text(section(unprofiled[1], "summary"))
    assert "Workers 1 (ranks 0)" in summary
    assert "Steps saved 40 (steps 0 to 39)" in summary and "Modes TRAIN, EVAL" in summary
    assert "LossNotDecreasing" in summary and "the service's defaults" in text(html_unescape(unprofiled[1]))
    assert "Workers 0" not in summary and "()" not in summary
    assert "n/a" not in summary and not re.search(r"<td>\s*</td>", section(unprofiled[1], "summary"))
    assert summary.count("Not recorded:") == 1 and "ran without profiling" in summary
    for absent in ("Nodes", "Sampling interval", "First step started", "Initialization"):
        assert absent not in summary


def html_unescape(html: str) -> str:
    import html as module

    return module.unescape(html)


def test_findings_are_listed_in_the_order_they_fired():
    from trainguard.report.data import ModelRuleResult

    rows = [
        ModelRuleResult("DeadRelu", "DeadRelu", "NoIssuesFound", "NoIssuesFound: fine."),
        ModelRuleResult("ExplodingTensor", "ExplodingTensor", "IssuesFound", "loss is NaN", step=300),
        ModelRuleResult("Overfit", "Overfit", "Error", "RuleInputMissing: no EVAL losses."),
        ModelRuleResult("LossNotDecreasing", "LossNotDecreasing", "IssuesFound", "flat", step=120),
        ModelRuleResult("AllZero", "AllZero", "NoIssuesFound", "NoIssuesFound: fine."),
    ]
    model = section(build_report(JobData(job="j", model_rules=rows)), "model-rules")
    shown = re.findall(r"<b>(\w+)</b>", model)
    # fired first, by step; then the rest in the job's configuration order (not alphabetical)
    assert shown == ["LossNotDecreasing", "ExplodingTensor", "Overfit", "DeadRelu", "AllZero"]
