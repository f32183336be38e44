"""The evaluate/clock functions' environment on moto, and S3-notification bodies, for tests."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import pytest
from trainguard.rules import plugins
from trainguard.service.pipeline import JobPipeline
from trainguard.service.publisher import Publisher
from trainguard.service.state_store import StateStore

#: a custom rule module whose rule never returns from ``update`` (a stuck rule, whatever the
#: cause: a user's own code, a regex, a slow dependency); ``time.sleep`` is interrupted by a signal
HANGING_RULES = """
import time

from trainguard.rules.base import Rule, RuleConfig, RuleState


class HangsConfig(RuleConfig):
    pass


class HangsState(RuleState):
    pass


class Hangs(Rule[HangsConfig, HangsState]):
    name = "Hangs"
    Config = HangsConfig
    State = HangsState
    summary = "Never returns (tests)."
    advice = ""
    uses_clock = True  # on the clock's tick too

    def update(self, state, step):
        time.sleep(3600)
        return state, []

    def check(self, state, now, *, started=None):
        time.sleep(3600)
        return state, []


RULES = [Hangs]
"""

HANGS = [{"RuleConfigurationName": "hangs", "RuleParameters": {"rule_to_invoke": "Hangs"}}]


def use_hanging_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "plugins"
    folder.mkdir(exist_ok=True)
    (folder / "hanging_rules.py").write_text(textwrap.dedent(HANGING_RULES))
    monkeypatch.setenv(plugins.ENV_VAR, f"{folder}:hanging_rules")
    plugins.reset()


def notification(bucket: str, *keys: str) -> str:
    """An S3 event notification's body (keys URL-encoded, as S3 sends them)."""
    return json.dumps(
        {
            "Records": [
                {
                    "eventVersion": "2.1",
                    "eventSource": "aws:s3",
                    "eventName": "ObjectCreated:Put",
                    "s3": {"bucket": {"name": bucket}, "object": {"key": quote_plus(key), "size": 1}},
                }
                for key in keys
            ]
        }
    )


def dlq_messages(aws: Any, url: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        got = aws.sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], AttributeNames=["All"]
        ).get("Messages", [])
        if not got:
            return out
        for message in got:
            out.append(message)
            aws.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


class Clock:
    """A wall clock the test moves (``clock.now += 3600``)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def clocked_pipeline(aws: Any, clock: Clock, **options: Any) -> JobPipeline:
    """A ``JobPipeline`` on the moto resources of ``aws``, on ``clock`` (options: budgets, stale_after_s)."""
    return JobPipeline(
        StateStore(aws.table, aws.ddb),
        aws.s3,
        Publisher(aws.events, aws.bus),
        bucket=aws.bucket,
        clock=clock,
        **options,
    )
