"""``trainguard`` command line: demo, local, replay, status, rules, report."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from trainguard.text import printable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainguard", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "demo", help="local mode on moto: a faulty job alerted and stopped, and its clean twin"
    )
    p.add_argument(
        "--fault",
        default="exploding",
        help="fault injected in the first job (exploding, dead-relu, flat-loss)",
    )
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--quiet", action="store_true", help="only the summary")

    p = sub.add_parser("local", help="run your training script against a local trainguard on moto")
    p.add_argument("--job", help="job name (default: the script's name)")
    p.add_argument(
        "--actions", help="JSON file of custom actions [{name, pattern, handler: 'file.py:function'}]"
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- python train.py ...")

    p = sub.add_parser("replay", help="evaluate a stored job offline with the same rules")
    p.add_argument("path", help="job folder or s3://bucket/prefix/<job>")
    p.add_argument("--rules", help="JSON file: DebugRuleConfigurations list (default: the job's own)")
    p.add_argument("--json", action="store_true", help="print a JSON array, one object per rule")
    p.add_argument("--no-progress", action="store_true")
    _rule_module_flag(p)

    p = sub.add_parser("status", help="jobs and their rule statuses from the state table")
    p.add_argument("job", nargs="?")
    p.add_argument(
        "--table", default=os.environ.get("TRAINGUARD_TABLE"), help="state table (or TRAINGUARD_TABLE)"
    )
    p.add_argument("--stack", default="TrainguardStack", help="read the table name from this stack's outputs")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("rules", help="every rule with its parameters and defaults")
    _rule_module_flag(p)

    p = sub.add_parser("report", help="write the HTML profiling report for a job")
    p.add_argument("path", help="job folder or s3://bucket/prefix/<job>")
    p.add_argument("--out", help="output file (default: report/profiler-report.html next to the job)")

    args = parser.parse_args(argv)
    handler = {
        "demo": _demo,
        "local": _local,
        "replay": _replay,
        "status": _status,
        "rules": _rules,
        "report": _report,
    }[args.command]
    return handler(args)


def _rule_module_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rule-module",
        action="append",
        default=[],
        metavar="[DIR:]MODULE",
        help="custom rules: a module with RULES = [...] (repeatable; adds to TRAINGUARD_RULE_MODULES)",
    )


def _use_rule_modules(extra: list[str]) -> bool:
    """Add ``--rule-module`` entries to TRAINGUARD_RULE_MODULES and load them all, strictly."""
    from trainguard.rules.plugins import ENV_VAR, PluginError, load_plugins

    entries = [e for e in os.environ.get(ENV_VAR, "").split(",") if e.strip()] + extra
    if extra:
        os.environ[ENV_VAR] = ",".join(dict.fromkeys(e.strip() for e in entries))
    try:
        load_plugins(strict=True)
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return False
    return True


def _demo(args: argparse.Namespace) -> int:
    from trainguard.local.demo import run_demo

    return run_demo(fault=args.fault, steps=args.steps, quiet=args.quiet)


def _local(args: argparse.Namespace) -> int:
    from trainguard.local.demo import run_local

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("usage: trainguard local [--job NAME] -- python train.py ...", file=sys.stderr)
        return 2
    actions = json.loads(Path(args.actions).read_text()) if args.actions else []
    return run_local(cmd, job=args.job, actions=actions)


def _replay(args: argparse.Namespace) -> int:
    from trainguard.engine.replay import replay

    if not _use_rule_modules(args.rule_module):
        return 2
    source = _open_source(args.path)
    rules: Any = None
    if args.rules:
        rules = json.loads(Path(args.rules).read_text())
        if isinstance(rules, dict) and "DebugRuleConfigurations" in rules:
            rules = rules["DebugRuleConfigurations"]
        if not isinstance(rules, list):
            print(f"{args.rules}: expected a JSON list of rule configurations", file=sys.stderr)
            return 2
    show = not args.no_progress and sys.stderr.isatty()
    result = replay(source, rules=rules, progress=_progress_bar if show else None)
    if show:
        sys.stderr.write("\n")
    for warning in result.warnings[:20]:
        print(f"warning: {printable(warning)}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.summary(), indent=2))
    else:
        _print_rules(
            result.state.job,
            [
                (r["RuleConfigurationName"], r["RuleEvaluationStatus"], r["StatusDetails"])
                for r in result.summary()
            ],
        )
    return 0


def _progress_bar(done: int, total: int) -> None:
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stderr.write(f"\rreading {done}/{total} objects [{'#' * filled}{'.' * (width - filled)}]")
    sys.stderr.flush()


def _open_source(path: str) -> Any:
    from trainguard.engine.sources import LocalJob

    if path.startswith("s3://"):
        from trainguard.service.clients import client
        from trainguard.service.s3_objects import S3Job

        return S3Job.from_uri(path, client("s3"))
    return LocalJob.open(path)


def _status(args: argparse.Namespace) -> int:
    from trainguard.service.clients import client
    from trainguard.service.state_store import StateStore

    table = args.table or _stack_output(args.stack, "StateTableName")
    if not table:
        print("no state table: pass --table, set TRAINGUARD_TABLE, or deploy the stack", file=sys.stderr)
        return 2
    store = StateStore(table, client("dynamodb"))
    return print_status(store, args.job, as_json=args.json)


def print_status(store: Any, job: str | None, as_json: bool = False) -> int:
    if job:
        loaded = store.load_state(job)
        if loaded is None:
            print(f"no job {job!r} in the state table", file=sys.stderr)
            return 1
        jobs = [loaded[0]]
    else:
        jobs = sorted(store.list_jobs(), key=lambda s: s.job)
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "TrainingJobName": s.job,
                        "TrainingJobStatus": s.training_status,
                        "LastStep": s.watermark,
                        "Dropped": s.dropped,
                        "DroppedObjects": s.dropped_objects,
                        "EndReason": s.end_reason,
                        "DebugRuleEvaluationStatuses": [
                            {
                                "RuleConfigurationName": r.name,
                                "RuleEvaluationStatus": r.status,
                                "StatusDetails": r.details,
                            }
                            for r in s.rules
                        ],
                    }
                    for s in jobs
                ],
                indent=2,
            )
        )
        return 0
    if not jobs:
        print("no jobs yet")
    for state in jobs:
        _print_rules(
            f"{state.job} ({state.training_status}, last step {state.watermark})",
            [(r.name, r.status, r.details) for r in state.rules],
        )
        if state.dropped or state.dropped_objects:
            print(printable(f"  dropped by the hook: {state.dropped_summary()}"))
        if state.end_reason:
            print(printable(f"  ended by trainguard: {state.end_reason}"))
    return 0


def _print_rules(title: str, rows: list[tuple[str, str, str]]) -> None:
    """Names and details come from jobs: escape bytes and control characters are shown escaped."""
    print(printable(title))
    rows = [(printable(n), printable(st), printable(d)) for n, st, d in rows]
    width = max((len(n) for n, _, _ in rows), default=10)
    for name, status, details in rows:
        short = details.split(". ", 1)[-1] if details.startswith("RuleEvaluationConditionMet") else details
        print(f"  {name:<{width}}  {status:<13}  {short[:160]}")


def _stack_output(stack: str, key: str) -> str | None:
    try:
        from trainguard.service.clients import client

        outputs = client("cloudformation").describe_stacks(StackName=stack)["Stacks"][0].get("Outputs", [])
    except Exception:
        return None
    return next((o["OutputValue"] for o in outputs if o["OutputKey"].startswith(key)), None)


def _rules(args: argparse.Namespace) -> int:
    from trainguard.rules.catalog import describe_rules

    if not _use_rule_modules(args.rule_module):
        return 2
    for row in describe_rules():
        params = ", ".join(f"{k}={v!r}" for k, v in row["parameters"].items()) or "(no parameters)"
        origin = "" if row["source"] == "trainguard" else f" (custom: {row['source']})"
        print(f"{row['name']:<28} [{row['kind']}] {row['summary']}{origin}")
        print(f"{'':<28} {params}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from trainguard.report import generate_report

    out = generate_report(args.path, args.out)
    print(out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
