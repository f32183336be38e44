"""Rules that fire on missing data run on the schedule (the clock function), locally too."""

import time

from trainguard.local.runtime import LocalCloud
from trainguard.local.synthetic import SyntheticJob
from trainguard.service import clients


def test_stalled_job_is_caught_by_the_schedule():
    rules = [
        {
            "RuleConfigurationName": "stall",
            "RuleParameters": {"rule_to_invoke": "StalledTrainingRule", "threshold": "2"},
        }
    ]
    # a 60 s schedule run 30 times faster: a tick every 2 s
    with LocalCloud(name="tg-clock", clock_speedup=30) as cloud:
        job = SyntheticJob("stalls", steps=[0, 1, 2], rules=rules, ended=False)
        objects = job.objects()
        s3 = clients.client("s3")
        for rel, body in objects.items():
            s3.put_object(Bucket=cloud.resources.bucket, Key=f"jobs/stalls/{rel}", Body=body)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            fired = [
                e["detail"] for e in cloud.events if e["detail"].get("RuleEvaluationStatus") == "IssuesFound"
            ]
            if fired:
                break
            time.sleep(0.2)
        assert fired and fired[0]["RuleConfigurationName"] == "stall"
        assert "no new data" in fired[0]["StatusDetails"]
