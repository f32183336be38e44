"""``trainguard`` command line: demo, local, replay, status, rules, report."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from trainguard.cli_errors import EXIT_BUG, EXIT_INTERRUPTED, EXIT_USAGE, CommandError, explain
from trainguard.engine.model import dropped_text
from trainguard.local import results
from trainguard.text import printable, shorten

RULES_HELP = (
    "JSON file of SageMaker rule configurations: a list, an object with DebugRuleConfigurations"
    "/ProfilerRuleConfigurations, or a whole CreateTrainingJob request"
)


def main(argv: list[str] | None = None) -> int:
    """Run one command; every expected failure is one line and exit code 2 (see cli_errors)."""
    parser = _parser()
    args = parser.parse_args(argv)
    handler = {
        "demo": _demo,
        "local": _local,
        "replay": _replay,
        "status": _status,
        "rules": _rules,
        "report": _report,
    }[args.command]
    try:
        return handler(args)
    except KeyboardInterrupt:
        print(f"trainguard {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `trainguard status | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:
        if getattr(args, "debug", False):  # --debug before or after the command
            traceback.print_exc()
        message = explain(exc)
        if message is None:
            print(
                f"trainguard {args.command}: unexpected error: {type(exc).__name__}: {exc} "
                "(run again with --debug for the traceback, and please report it)",
                file=sys.stderr,
            )
            return EXIT_BUG
        print(f"trainguard {args.command}: {message}", file=sys.stderr)
        return EXIT_USAGE


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the traceback of an error",
    )
    parser = argparse.ArgumentParser(
        prog="trainguard",
        description="trainguard: catch training jobs that fail quietly (rules, alerts, stop).",
        epilog="An error reads 'trainguard <command>: <what is wrong>', exit code 2; --debug: the traceback.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "demo",
        parents=[common],
        help="local mode on moto: a faulty job alerted and stopped, and its clean twin",
    )
    p.add_argument(
        "--fault",
        default="exploding",
        help="fault injected in the first job (exploding, dead-relu, flat-loss)",
    )
    p.add_argument("--steps", type=int, default=120, help="training steps of each demo job (default: 120)")
    p.add_argument("--quiet", action="store_true", help="only the summary")
    _local_flags(p)

    p = sub.add_parser(
        "local", parents=[common], help="run your training script against a local trainguard on moto"
    )
    p.add_argument("--job", help="job name (default: the script's name)")
    p.add_argument(
        "--actions", help="JSON file of custom actions [{name, pattern, handler: 'file.py:function'}]"
    )
    p.add_argument(
        "--rules", help=RULES_HELP + " (for jobs that declare none, like the stack's defaultRules)"
    )
    _local_flags(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- python train.py ...")

    p = sub.add_parser("replay", parents=[common], help="evaluate a stored job offline with the same rules")
    p.add_argument(
        "path",
        nargs="?",
        help="job folder, s3://bucket/prefix/<job>, or a job kept under runs/ (default: the last local job)",
    )
    p.add_argument("--rules", help=RULES_HELP + " (default: the job's own)")
    p.add_argument("--json", action="store_true", help="print a JSON array, one object per rule")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar while the objects are read (stderr)"
    )
    p.add_argument("--runs", type=Path, default=results.DEFAULT_RUNS, help="where local runs are kept")
    _rule_module_flag(p)

    p = sub.add_parser(
        "status",
        parents=[common],
        help="jobs and their rule statuses: the running or last local run, or a deployed stack",
    )
    p.add_argument("job", nargs="?")
    p.add_argument(
        "--table", default=os.environ.get("TRAINGUARD_TABLE"), help="state table (or TRAINGUARD_TABLE)"
    )
    p.add_argument(
        "--stack",
        help="read the table name from this deployed stack's outputs (default TrainguardStack, "
        "when there are no local results and AWS credentials are configured)",
    )
    p.add_argument("--region", help="AWS region of the table or stack (default: AWS_DEFAULT_REGION)")
    p.add_argument("--runs", type=Path, default=results.DEFAULT_RUNS, help="where local runs are kept")
    p.add_argument("--json", action="store_true", help="print a JSON array, one object per job")

    p = sub.add_parser("rules", parents=[common], help="every rule with its parameters and defaults")
    _rule_module_flag(p)

    p = sub.add_parser("report", parents=[common], help="write the HTML profiling report for a job")
    p.add_argument(
        "path",
        nargs="?",
        help="job folder, s3://bucket/prefix/<job>, or a job kept under runs/ (default: the last local job)",
    )
    p.add_argument("--out", help="output file (default: report/profiler-report.html next to the job)")
    p.add_argument("--runs", type=Path, default=results.DEFAULT_RUNS, help="where local runs are kept")
    return parser


def _local_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runs",
        type=Path,
        default=results.DEFAULT_RUNS,
        help="keep each job here: <runs>/<job>/ and <runs>/_trainguard/ (default: runs)",
    )
    p.add_argument("--verbose", action="store_true", help="also a line per function invocation")


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
    from trainguard.rules.plugins import ENV_VAR, load_plugins

    entries = [e for e in os.environ.get(ENV_VAR, "").split(",") if e.strip()] + extra
    if extra:
        os.environ[ENV_VAR] = ",".join(dict.fromkeys(e.strip() for e in entries))
    load_plugins(strict=True)  # a PluginError is explained by the error boundary
    return True


def _demo(args: argparse.Namespace) -> int:
    from trainguard.local.demo import run_demo

    return run_demo(
        fault=args.fault, steps=args.steps, quiet=args.quiet, verbose=args.verbose, runs=args.runs
    )


def _local(args: argparse.Namespace) -> int:
    from trainguard.local.demo import run_local

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise CommandError("no command to run: trainguard local [--job NAME] -- python train.py ...")
    actions = _actions(Path(args.actions)) if args.actions else []
    if args.rules:
        from trainguard.rules.config import DEFAULT_RULES_ENV

        entries = _load_rules(args.rules)
        _check_rules(args.rules, entries)  # before the run: a wrong file is not found at its end
        # the local stack's defaultRules: what the deployed stack's functions read
        os.environ[DEFAULT_RULES_ENV] = json.dumps(entries, separators=(",", ":"))
    return run_local(cmd, job=args.job, actions=actions, runs=args.runs, verbose=args.verbose)


def _actions(path: Path) -> list[dict[str, Any]]:
    """``--actions FILE``: a JSON list of ``{name, pattern, handler}``."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CommandError(f"{path}: not valid JSON (line {exc.lineno}): {exc.msg}") from None
    problems = []
    if not isinstance(doc, list):
        problems.append("expected a JSON list")
    else:
        for index, action in enumerate(doc):
            if not isinstance(action, dict) or not {"name", "pattern", "handler"} <= set(action):
                problems.append(f"entry {index} needs name, pattern and handler")
            elif not isinstance(action["pattern"], dict) or ":" not in str(action["handler"]):
                problems.append(f"entry {index}: pattern is an object, handler is 'file.py:function'")
            elif not Path(str(action["handler"]).rpartition(":")[0]).is_file():
                problems.append(
                    f"entry {index}: no handler file {str(action['handler']).rpartition(':')[0]!r}"
                )
    if problems:
        raise CommandError(f"{path}: {'; '.join(problems)} (see examples/custom_action/actions.json)")
    return doc  # type: ignore[no-any-return]


def _load_rules(path: str) -> list[dict[str, Any]]:
    """Every rule entry of a rules file (any SageMaker shape)."""
    from trainguard.rules.sagemaker import RulesFormatError, load_rules_file

    try:
        return load_rules_file(path).entries()
    except (RulesFormatError, OSError) as exc:
        text = str(exc).removeprefix(f"{path}: ")  # the file is named once
        raise CommandError(f"--rules {path}: {text}") from None


def _check_rules(path: str, entries: list[dict[str, Any]]) -> None:
    """Every entry names a known rule with valid parameters (custom rule modules loaded first)."""
    from trainguard.rules.config import parse_rule_configurations

    _use_rule_modules([])
    bad = [f"{c.configuration_name}: {c.error}" for c in parse_rule_configurations(entries) if c.error]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise CommandError(f"--rules {path}: {bad[0]}{more}")


def _replay(args: argparse.Namespace) -> int:
    from trainguard.engine.replay import replay

    path = _job_path(args.path, args.runs, "replay")
    if path.startswith("s3://"):
        _check_s3_job(path)
    _use_rule_modules(args.rule_module)
    source = _open_source(path)
    rules: Any = None
    if args.rules:
        rules = _load_rules(args.rules)
    show = not args.no_progress and sys.stderr.isatty()
    result = replay(source, rules=rules, progress=_progress_bar if show else None)
    if show:
        sys.stderr.write("\n")
    for warning in result.warnings[:20]:
        print(f"warning: {printable(warning)}", file=sys.stderr)
    if len(result.warnings) > 20:
        print(f"warning: {len(result.warnings) - 20} more warnings not shown", file=sys.stderr)
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


def _job_path(path: str | None, runs: Path, command: str) -> str:
    """The job a command reads: a folder, an s3:// URL, a job kept under ``runs/``, or the last one.

    Checked here so that a wrong path is one clear sentence, and nothing is created.
    """
    if path is None:
        kept = results.last_jobs(runs)
        if len(kept) == 1:
            print(f"(the job of the last local run: {kept[0]})", file=sys.stderr)
            return str(kept[0])
        if kept:
            names = ", ".join(str(k) for k in kept)
            raise CommandError(f"the last local run kept {len(kept)} jobs: {names}; name one")
        raise CommandError(
            f"no job given and no local run kept under {runs}/: trainguard {command} "
            "runs/<job> | s3://bucket/prefix/<job> (or run `trainguard local -- python train.py` first)"
        )
    if path.startswith("s3://"):
        from trainguard.hook.storage import parse_s3_url

        try:
            bucket, prefix = parse_s3_url(path)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if not prefix:
            raise CommandError(f"{path}: name the job folder, s3://{bucket}/<prefix>/<job>")
        return path
    if "://" in path:
        scheme = path.split("://", 1)[0]
        raise CommandError(
            f"{path}: unsupported URL scheme {scheme!r}; give a local job folder or s3://bucket/prefix/<job>"
        )
    folder = Path(path)
    if not folder.exists():
        named = results.local_job_folder(runs, path) if "/" not in path else None
        if named is not None:
            return str(named)
        hint = _known_jobs_hint(runs)
        raise CommandError(
            f"{path}: no such job folder; give the hook's out_dir (a folder with manifest.json, "
            f"steps/ or segments/) or s3://bucket/prefix/<job>{hint}"
        )
    if not folder.is_dir():
        raise CommandError(f"{path}: is a file, not a job folder")
    _check_job_folder(path, folder)
    return path


#: what only a job folder holds (a report/ or control/ alone is not a job)
_JOB_KINDS = frozenset({"manifest", "step", "segment", "end", "system"})
_NOT_A_JOB = (
    "not a trainguard job folder (no manifest.json, and no objects under steps/, segments/, "
    "system/ or end/); give the hook's out_dir or s3://bucket/prefix/<job>"
)


def _check_job_folder(path: str, folder: Path) -> None:
    """A folder a command reads must be a job: nothing is evaluated, or written, in another."""
    from trainguard.format.layout import LayoutError, parse_relative, validate_job_name

    has_manifest = (folder / "manifest.json").is_file()
    if not has_manifest and not any(
        _job_object(folder, sub, parse_relative, LayoutError)
        for sub in ("steps", "segments", "end", "system")
    ):
        raise CommandError(f"{path}: {_NOT_A_JOB}")
    name = folder.resolve().name
    if not has_manifest:
        try:
            validate_job_name(name)
        except LayoutError:
            raise CommandError(
                f"{path}: no manifest.json to name the job, and the folder name {name!r} is not a job "
                "name (letters, digits, '-', '_', '.'); rename the folder to the job's name"
            ) from None


def _job_object(folder: Path, sub: str, parse: Any, error: type[Exception]) -> bool:
    where = folder / sub
    if not where.is_dir():
        return False
    for item in where.rglob("*"):
        if item.is_file():
            try:
                if parse("job", item.relative_to(folder).as_posix()).kind.value in _JOB_KINDS:
                    return True
            except error:
                continue
    return False


def _known_jobs_hint(runs: Path) -> str:
    try:
        kept = [str(doc.get("Folder")) for doc in results.saved_jobs(runs)]
    except CommandError:
        return ""
    return f" (kept locally: {', '.join(kept[:8])})" if kept else ""


def _open_source(path: str) -> Any:
    from trainguard.engine.sources import LocalJob

    if path.startswith("s3://"):
        from trainguard.service.clients import client
        from trainguard.service.s3_objects import S3Job

        return S3Job.from_uri(path, client("s3"))
    return LocalJob.open(path)


def _status(args: argparse.Namespace) -> int:
    """Where statuses come from, first that applies: --table; a running local session; the
    last local run's saved results; a deployed stack (only with AWS credentials at hand)."""
    if args.table:
        return print_store_status(_table_store(args.table, args.region), args.job, args.json)
    session = results.read_session(args.runs)
    if session is not None and session.live and args.stack is None:
        from botocore.exceptions import BotoCoreError, ClientError

        store = results.live_state_store(session)
        try:
            if not args.json:
                print(f"(the running trainguard {session.command}, pid {session.pid}: {session.endpoint})")
            return print_store_status(store, args.job, args.json)
        except (BotoCoreError, ClientError) as exc:
            print(
                f"the running trainguard {session.command} (pid {session.pid}) does not answer ({exc}); "
                "showing what it kept so far",
                file=sys.stderr,
            )
    saved = results.saved_jobs(args.runs)
    if saved and args.stack is None:
        return _print_saved(saved, args.job, args.json, args.runs)
    if args.stack is None and not _have_credentials():
        raise CommandError(
            f"no local results under {args.runs}/ and no AWS credentials: run `trainguard demo` or "
            "`trainguard local -- python train.py` first, or pass --table/--stack with credentials "
            "for a deployed stack"
        )
    stack = args.stack or "TrainguardStack"
    table = _stack_output(stack, "StateTableName", args.region)
    if not table:
        raise CommandError(f"stack {stack} has no StateTableName output: pass --table, or deploy the stack")
    return print_store_status(_table_store(table, args.region), args.job, args.json)


def _table_store(table: str, region: str | None) -> Any:
    import boto3

    from trainguard.service.state_store import StateStore

    return StateStore(table, boto3.client("dynamodb", region_name=region) if region else _client("dynamodb"))


def _client(service: str) -> Any:
    from trainguard.service.clients import client

    return client(service)


def _have_credentials() -> bool:
    """AWS credentials from anywhere but the instance-metadata service (no network probe).

    On EC2 with only an instance role, pass --table or --stack: then botocore's whole chain runs.
    """
    import botocore.session
    from botocore.credentials import create_credential_resolver

    session = botocore.session.get_session()
    resolver = create_credential_resolver(session)
    resolver.remove("iam-role")  # the instance-metadata address: a 1 s timeout per try elsewhere
    try:
        return resolver.load_credentials() is not None
    except Exception:  # a broken profile is not credentials; the user gets the sentence above
        return False


def print_store_status(store: Any, job: str | None, as_json: bool = False) -> int:
    """Jobs from a state table (deployed, or a running local cloud's)."""
    if job:
        loaded = store.load_state(job)
        if loaded is None:
            raise CommandError(f"no job {job!r} in the state table {store.table}")
        states = [loaded[0]]
    else:
        states = sorted(store.list_jobs(), key=lambda s: s.job)
    return print_jobs([results.job_entry(s) for s in states], as_json)


def _print_saved(saved: list[dict[str, Any]], job: str | None, as_json: bool, runs: Path) -> int:
    if job:
        saved = [d for d in saved if d.get("TrainingJobName") == job]
        if not saved:
            raise CommandError(f"no job {job!r} kept under {runs}/ (trainguard status lists them)")
    session = results.read_session(runs)
    fields = (
        "TrainingJobName",
        "TrainingJobStatus",
        "LastStep",
        "StepsEvaluated",
        "DebugRuleEvaluationStatuses",
        "Dropped",
        "DroppedObjects",
        "EndReason",
    )
    entries = [{k: d.get(k) for k in fields} for d in saved]
    if as_json:
        return print_jobs(entries, as_json)
    # the last run's jobs in the order it ran them, then what earlier runs kept (by name)
    order = {name: i for i, name in enumerate(session.jobs)} if session is not None else {}
    last = sorted(
        (e for e in entries if e["TrainingJobName"] in order), key=lambda e: order[str(e["TrainingJobName"])]
    )
    earlier = [e for e in entries if e["TrainingJobName"] not in order]
    if last:
        when = ""
        if session is not None and session.finished is not None:
            when = f", finished {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(session.finished))}"
        count = f"{len(last)} job{'s' if len(last) > 1 else ''}"
        print(f"(the last local run{when}: {count}, kept under {runs}/)")
        print_jobs(last)
    if earlier:
        count = f"{len(earlier)} job{'s' if len(earlier) > 1 else ''}"
        print(f"(kept by earlier local runs under {runs}/: {count})")
        print_jobs(earlier)
    return 0


def print_jobs(entries: list[dict[str, Any]], as_json: bool = False) -> int:
    """Print jobs in the ``status --json`` shape (:func:`trainguard.local.results.job_entry`)."""
    if as_json:
        print(json.dumps(entries, indent=2))
        return 0
    if not entries:
        print("no jobs yet")
    for entry in entries:
        _print_rules(
            f"{entry['TrainingJobName']} ({entry['TrainingJobStatus']}, last step {entry['LastStep']})",
            [
                (r["RuleConfigurationName"], r["RuleEvaluationStatus"], r.get("StatusDetails", ""))
                for r in entry.get("DebugRuleEvaluationStatuses") or []
            ],
        )
        dropped = dropped_text(entry.get("Dropped") or {}, entry.get("DroppedObjects") or 0)
        if dropped:
            print(printable(f"  dropped by the hook: {dropped}"))
        if entry.get("EndReason"):
            print(printable(f"  ended by trainguard: {entry['EndReason']}"))
    return 0


def _print_rules(title: str, rows: list[tuple[str, str, str]]) -> None:
    """Names and details come from jobs: escape bytes and control characters are shown escaped."""
    print(printable(title))
    rows = [(printable(n), printable(st), printable(d)) for n, st, d in rows]
    width = max((len(n) for n, _, _ in rows), default=10)
    for name, status, details in rows:
        short = details.split(". ", 1)[-1] if details.startswith("RuleEvaluationConditionMet") else details
        print(f"  {name:<{width}}  {status:<13}  {shorten(short, 160)}")


def _stack_output(stack: str, key: str, region: str | None = None) -> str | None:
    import boto3

    cfn = boto3.client("cloudformation", region_name=region) if region else _client("cloudformation")
    try:
        outputs = cfn.describe_stacks(StackName=stack)["Stacks"][0].get("Outputs", [])
    except cfn.exceptions.ClientError as exc:
        if "does not exist" in str(exc):
            raise CommandError(
                f"no stack {stack} in this account and region: pass --stack NAME and --region, "
                "or --table, or deploy it (docs/deploy.md)"
            ) from None
        raise
    return next((o["OutputValue"] for o in outputs if o["OutputKey"].startswith(key)), None)


def _rules(args: argparse.Namespace) -> int:
    from trainguard.rules.catalog import describe_rules

    _use_rule_modules(args.rule_module)
    for row in describe_rules():
        origin = "" if row["source"] == "trainguard" else f" (custom: {row['source']})"
        print(f"{row['name']:<28} [{row['kind']}] {row['summary']}{origin}")
        if row["method"]:
            print(f"{'':<28} method: {row['method']}")
        if row["false_alarm_budget"]:
            print(f"{'':<28} false alarms: {row['false_alarm_budget']}")
        if not row["details"]:
            print(f"{'':<28} (no parameters)")
        for p in row["details"]:
            default = "(required)" if p["default"] is None else repr(p["default"])
            same = p["sagemaker"] in (p["default"], "required") and not p["why"]
            sagemaker = "" if same else f"  [SageMaker: {p['sagemaker']}]"
            print(f"{'':<28} {p['name']}={default}{sagemaker}")
            if p["why"]:
                print(f"{'':<32}why: {p['why']}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from trainguard.report import generate_report

    path = _job_path(args.path, args.runs, "report")
    if path.startswith("s3://"):
        _check_s3_job(path)
    if args.out is not None:
        _check_out(args.out)
    try:
        out = generate_report(path, args.out)
    except OSError as exc:
        if args.out is None or not _about(exc, args.out):
            raise
        raise CommandError(f"--out {args.out}: {_out_problem(args.out, exc)}") from None
    print(out)
    return 0


def _check_out(out: str) -> None:
    """Say why ``--out`` cannot be written before the report is built (nothing half-written)."""
    target = Path(out)
    if target.is_dir():
        raise CommandError(f"--out {out}: is a folder; name the file (--out {out.rstrip('/')}/report.html)")
    existing = _existing_parent(target)
    if not existing.is_dir():
        raise CommandError(f"--out {out}: {existing} is not a folder")
    if not os.access(existing, os.W_OK):
        raise CommandError(f"--out {out}: {existing}: permission denied (cannot create files there)")


def _existing_parent(target: Path) -> Path:
    parent = target.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def _about(exc: OSError, out: str) -> bool:
    """Whether an OSError was raised writing ``out`` (or making its folders), not reading the job."""
    if exc.filename is None:
        return False
    named = Path(os.fsdecode(exc.filename)).absolute()
    target = Path(out).absolute()
    return named == target or named in target.parents


def _out_problem(out: str, exc: OSError) -> str:
    """The true reason a file cannot be written, from the place it failed."""
    import errno

    existing = _existing_parent(Path(out))
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{existing}: permission denied (cannot create files there)"
    if exc.errno == errno.EROFS:
        return f"{existing} is on a read-only file system"
    if exc.errno == errno.EISDIR:
        return "is a folder; name the file"
    if exc.errno == errno.ENOENT:  # the folder exists, yet creating in it said "no such file"
        return f"{existing} does not allow creating files (a virtual or read-only file system)"
    return f"cannot be written: {exc.strerror or exc}"


def _check_s3_job(url: str) -> None:
    """An S3 job folder must hold a job's objects (a report of nothing would look fine)."""
    from trainguard.format.layout import LayoutError, parse_relative
    from trainguard.hook.storage import S3Store

    store = S3Store(url, client=_client("s3"))
    prefix = f"{store.prefix}/"
    # one page: a job's manifest, end/, segments/ and steps/ sort before most else
    response = store.client.list_objects_v2(Bucket=store.bucket, Prefix=prefix, MaxKeys=1000)
    keys = [o["Key"][len(prefix) :] for o in response.get("Contents", [])]
    if not keys:
        raise CommandError(f"{url}: no objects there; check the job name and the prefix")
    for key in keys:
        try:
            if parse_relative("job", key).kind.value in _JOB_KINDS:
                return
        except LayoutError:
            continue
    if response.get("IsTruncated"):
        return  # more than a page of other objects: replay reads on and says what it found
    raise CommandError(f"{url}: {_NOT_A_JOB}")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
