"""A custom trainguard action: any Lambda with this signature can be attached to the bus.

It receives the EventBridge event exactly as deployed Lambdas do (``event["detail"]`` is the
``trainguard.rule-status/1`` contract). This one records issues to a JSON-lines file (path
from ``TRAINGUARD_ACTION_LOG``, default /tmp) — replace the body with a Slack webhook, a
ticket, a Kubernetes job deletion...
"""

import json
import os


def handler(event, context):
    detail = event["detail"]
    line = {
        "job": detail["TrainingJobName"],
        "rule": detail["RuleConfigurationName"],
        "status": detail["RuleEvaluationStatus"],
        "step": detail.get("Step"),
        "details": detail["StatusDetails"],
    }
    path = os.environ.get("TRAINGUARD_ACTION_LOG", "/tmp/trainguard-actions.jsonl")
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
    print(f"custom action: {line['job']} / {line['rule']} -> {line['status']} at step {line['step']}")
    return {"recorded": True}
