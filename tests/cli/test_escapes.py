"""Terminal escape bytes in job data are shown escaped at every output boundary, never obeyed.

A rule configuration name, a tensor name or a status detail is the job's own text: printed
raw, ``\\x1b[2J`` clears the reader's screen and OSC 8 forges a link. ``trainguard replay``,
``trainguard status`` and the alert email, SMS and subject escape them; what is stored is
unchanged.
"""

from __future__ import annotations

import json
import math

from trainguard.cli import main, print_store_status
from trainguard.engine.events import RuleStatusDetail
from trainguard.format import documents as d
from trainguard.format import layout
from trainguard.service.alerts import render
from trainguard.text import ascii_text, printable

ESCAPES = "\x1b[2J\x1b]8;;http://evil.example/\x07click\x1b]8;;\x07\u202e"
RULE = f"nan{ESCAPES}check"
TENSOR = f"loss{ESCAPES}"
RULES = [{"RuleConfigurationName": RULE, "RuleParameters": {"rule_to_invoke": "ExplodingTensor"}}]


def hostile_job(job: str) -> dict[str, bytes]:
    """A job whose rule and scalar names carry escape sequences; the scalar is NaN at step 1."""
    manifest = d.Manifest(job=job, created=1_800_000_000.0, hook_version="x", world_size=1, rules=RULES)
    out = {layout.MANIFEST: d.dump_document(manifest)}
    prev = None
    for step in (0, 1):
        value = math.nan if step == 1 else 0.5
        header = d.StepHeader(
            job=job,
            step=step,
            worker=0,
            world_size=1,
            prev_step=prev,
            wall_time=1_800_000_000.0 + step,
            modes={
                "TRAIN": d.ModeRecord(
                    mode_step=step, scalars={TENSOR: d.ScalarRecord(value=value, collections=["losses"])}
                )
            },
        )
        out[layout.step_key(step, 0)] = d.encode_step(header, {})
        prev = step
    marker = d.EndMarker(job=job, worker=0, world_size=1, last_step=1, wall_time=1_800_000_002.0)
    out[layout.end_key(0)] = d.dump_document(marker)
    return out


def raw_controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0 or c == "\u202e"]


def test_printable_escapes_controls_and_keeps_letters():
    assert printable("a\x1b[31mb") == "a\\x1b[31mb"
    assert printable("日本語 é \U0001d538") == "日本語 é \U0001d538"
    assert printable("x\u202ey\u200b") == "x\\u202ey\\u200b"
    assert printable("two\nlines", keep_newlines=True) == "two\nlines"
    assert printable("two\nlines") == "two\\x0alines"
    assert ascii_text("é\x07") == "\\xe9\\x07"


def test_replay_prints_names_escaped(tmp_path, capsys):
    folder = tmp_path / "esc"
    for rel, body in hostile_job("esc").items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(body)
    assert main(["replay", str(folder), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert not raw_controls(captured.out) and not raw_controls(captured.err)
    assert "nan\\x1b[2J\\x1b]8;;http://evil.example/\\x07click" in captured.out
    assert "IssuesFound" in captured.out
    # --json is JSON: its escapes are JSON's, and the names parse back unchanged
    assert main(["replay", str(folder), "--no-progress", "--json"]) == 0
    out = capsys.readouterr().out
    assert not raw_controls(out) and json.loads(out)[0]["RuleConfigurationName"] == RULE


def test_status_prints_names_escaped_and_stores_them_unchanged(aws, capsys):
    service = aws.service()
    for key in sorted(aws.put_job("esc", hostile_job("esc")), key=lambda k: not k.endswith("manifest.json")):
        service.handle_object(aws.bucket, key)
    state, _ = service.store.load_state("esc")
    assert state.rule(RULE).status == "IssuesFound" and state.rule(RULE).tensor == TENSOR  # stored as sent
    assert print_store_status(service.store, None) == 0
    out = capsys.readouterr().out
    assert not raw_controls(out) and "nan\\x1b[2J" in out and "IssuesFound" in out


def test_the_alert_email_sms_and_subject_are_escaped():
    detail = RuleStatusDetail(
        EventId=f"esc/{RULE}/2",
        TrainingJobName="esc",
        RuleConfigurationName=RULE,
        RuleName="ExplodingTensor",
        RuleEvaluationStatus="IssuesFound",
        StatusDetails=f"scalar {TENSOR} is nan",
        LastModifiedTime=1_800_000_000.0,
        Step=1,
        Tensor=TENSOR,
        Actions=["Email", "SMS"],
    )
    alert = render(detail)
    for text in (alert.subject, alert.email, alert.sms):
        assert not raw_controls(text)
    assert alert.subject.isascii() and "\\x1b[2J" in alert.subject
    assert "Tensor:        loss\\x1b[2J" in alert.email
