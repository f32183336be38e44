"""Run the accuracy benchmark and rewrite docs/accuracy.md.

python -m bench.accuracy                 # full: 22 faulty configurations x 5 seeds + clean twins
python -m bench.accuracy --quick         # smoke run: 2 seeds, 60 steps, no doc rewrite
python bench/accuracy/run.py --jobs 2 --results /tmp/accuracy.json
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench.accuracy`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trainguard.hook.config import DEFAULT_TENSOR_INTERVAL

from bench.accuracy.faults import BASES, FAULTS
from bench.accuracy.score import render

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "accuracy.md"


def plan(seeds: int, steps: int | None, tensor_interval: int | None) -> list[dict[str, Any]]:
    """Every run: the clean twins (one per base and seed), then each fault on each seed."""
    runs: list[dict[str, Any]] = []
    for seed in range(seeds):
        for base, cfg in BASES.items():
            c = cfg.but(seed=seed, **({"steps": steps} if steps else {}))
            runs.append(
                {"id": f"clean-{base}-s{seed}", "fault": None, "base": base, "seed": seed, "config": c}
            )
        for fault in FAULTS:
            c = fault.config(seed)
            if steps:
                c = c.but(steps=steps)
            runs.append(
                {
                    "id": f"{fault.name}-{fault.base}-s{seed}",
                    "fault": fault.name,
                    "base": fault.base,
                    "seed": seed,
                    "config": c,
                }
            )
    for run in runs:
        run["tensor_interval"] = tensor_interval
    return runs


def _work(item: tuple[dict[str, Any], str]) -> dict[str, Any]:
    run, workdir = item
    logging.getLogger("trainguard").setLevel(logging.ERROR)
    from bench.accuracy.train import run_one

    record = run_one(run["id"], run["config"], Path(workdir), tensor_interval=run["tensor_interval"])
    record.update(
        {"fault": run["fault"], "base": run["base"], "seed": run["seed"], "steps": run["config"].steps}
    )
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="2 seeds, 60 steps; prints the table, keeps the doc"
    )
    parser.add_argument("--seeds", type=int, default=None, help="seeds per configuration (default 5)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument(
        "--results", type=Path, default=None, help="also write the raw per-run records (JSON)"
    )
    parser.add_argument(
        "--from-results", type=Path, default=None, help="re-render the doc from saved records"
    )
    parser.add_argument("--doc", type=Path, default=DOCS, help="the Markdown file to write")
    parser.add_argument(
        "--tensor-interval",
        type=int,
        default=None,
        help="save every tensor collection every N steps instead of the hook's default (labelled in the doc)",
    )
    args = parser.parse_args(argv)
    seeds = args.seeds or (2 if args.quick else 5)
    started = time.perf_counter()
    if args.from_results:
        payload = json.loads(args.from_results.read_text())
        records, meta = payload["records"], payload["meta"]
    else:
        runs = plan(seeds, 60 if args.quick else None, args.tensor_interval)
        records = []
        with tempfile.TemporaryDirectory(prefix="tg-accuracy-") as workdir:
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(args.jobs) as pool:
                for i, record in enumerate(pool.imap_unordered(_work, [(r, workdir) for r in runs]), 1):
                    records.append(record)
                    print(
                        f"[{i}/{len(runs)}] {record['run']} ({record['seconds_train']:.1f}s)", file=sys.stderr
                    )
        meta = {
            "seeds": seeds,
            "jobs": args.jobs,
            "cpus": os.cpu_count(),
            "wall_s": round(time.perf_counter() - started, 1),
            "quick": args.quick,
            "torch": _torch_version(),
            "tensor_interval": args.tensor_interval or DEFAULT_TENSOR_INTERVAL,
            "interval_is_default": args.tensor_interval in (None, DEFAULT_TENSOR_INTERVAL),
        }
        if args.results:
            args.results.write_text(json.dumps({"meta": meta, "records": records}))
    text = render(records, meta)
    if args.quick and not args.from_results:
        print(text)
    else:
        args.doc.write_text(text)
        print(f"wrote {args.doc} ({len(records)} runs, {meta['wall_s']} s)", file=sys.stderr)
    return 0


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


if __name__ == "__main__":
    sys.exit(main())
