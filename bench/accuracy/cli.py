"""Command line of the accuracy benchmark.

python -m bench.accuracy all --workers 2      # generate what is missing, label, score, rewrite the doc
python -m bench.accuracy generate --split dev --phase clean --workers 2
python -m bench.accuracy generate --split dev --phase faults
python -m bench.accuracy label                # rewrite every run's labels.json
python -m bench.accuracy score                # replay stored runs with the rules, rewrite docs/accuracy.md
python -m bench.accuracy tune                 # dev split only: every candidate, the choice per rule
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = Path(os.environ.get("TG_ACCURACY_CACHE", ROOT / "bench" / "out" / "accuracy-corpus"))
DOCS = ROOT / "docs" / "accuracy.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help="corpus folder (default %(default)s)"
    )
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("generate", help="train missing runs")
    gen.add_argument("--split", choices=("dev", "test", "all"), default="all")
    gen.add_argument("--phase", choices=("clean", "faults", "all"), default="all")
    gen.add_argument("--workers", type=int, default=1)
    gen.add_argument("--per-cell", type=int, default=1, help="fault runs per (fault, grade, family)")
    sub.add_parser("label", help="label every stored run")
    sc = sub.add_parser("score", help="replay the stored runs with the rules; rewrite the doc")
    sc.add_argument("--workers", type=int, default=1)
    sc.add_argument("--doc", type=Path, default=DOCS)
    sc.add_argument("--defaults-only", action="store_true", help="score only the default configurations")
    sc.add_argument(
        "--eval-every-step",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also score the profile that saves every EVAL step (a third full replay of every run)",
    )
    tn = sub.add_parser("tune", help="score every candidate on the dev split; print the choice per rule")
    tn.add_argument("--workers", type=int, default=1)
    tn.add_argument("--out", type=Path, default=None, help="write the table here (default: stdout)")
    full = sub.add_parser("all", help="generate what is missing, then score (the default command)")
    full.add_argument("--workers", type=int, default=1)
    full.add_argument("--doc", type=Path, default=DOCS)
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args([*(argv or sys.argv[1:]), "all"])
    cache: Path = args.cache
    cache.mkdir(parents=True, exist_ok=True)
    if args.command == "generate":
        from bench.accuracy import generate

        splits = ("dev", "test") if args.split == "all" else (args.split,)
        phases = ("clean", "faults") if args.phase == "all" else (args.phase,)
        failures = []
        for split in splits:
            for phase in phases:
                # the clean phase twice: its second plan adds the extra seeds of the
                # configurations that trained well in the first
                for _ in range(2 if phase == "clean" else 1):
                    specs = generate.planned(split, cache, phase, args.per_cell)
                    failures += generate.run(specs, cache, args.workers)
        for run_id, error in failures:
            print(f"FAILED {run_id}: {error}", file=sys.stderr)
        return 1 if failures else 0
    if args.command == "label":
        from bench.accuracy.labels import label_corpus

        labelled = label_corpus(cache)
        print(f"labelled {len(labelled)} runs", file=sys.stderr)
        return 0
    if args.command == "tune":
        from bench.accuracy.evaluate import evaluate
        from bench.accuracy.report import render_dev_choices

        ev = evaluate(cache, workers=args.workers, dev_only=True)
        text = render_dev_choices(ev)
        if args.out is None:
            print(text)
        else:
            args.out.write_text(text)
        return 0
    if args.command in ("score", "all"):
        if args.command == "all":
            from bench.accuracy import generate

            for split in ("dev", "test"):
                for phase in ("clean", "clean", "faults"):
                    generate.run(generate.planned(split, cache, phase), cache, args.workers)
        from bench.accuracy.evaluate import evaluate
        from bench.accuracy.report import render

        ev = evaluate(
            cache,
            workers=args.workers,
            only_defaults=getattr(args, "defaults_only", False),
            eval_every_step=getattr(args, "eval_every_step", True),
        )
        text = render(ev, {"cache": str(cache)})
        args.doc.write_text(text)
        print(f"wrote {args.doc} ({len(ev.runs)} runs)", file=sys.stderr)
        return 0
    parser.print_help()
    return 0
