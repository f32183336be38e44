"""Generate the corpus: resumable (runs already stored are skipped), in worker processes.

Phase ``clean`` trains a split's sweep; phase ``faults`` needs the split's clean runs on
disk (the twins are drawn among the runs labelled clean) and trains every fault run.
Run it under ``nice -n 19``; ``--workers`` 1-2 on a shared machine.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import sys
import time
from pathlib import Path

from bench.accuracy import labels, plan
from bench.accuracy.plan import RunSpec


def _work(item: tuple[dict[str, object], str]) -> tuple[str, float, str | None]:
    raw, cache = item
    spec = RunSpec.from_json(raw)  # type: ignore[arg-type]
    logging.getLogger("trainguard").setLevel(logging.ERROR)
    from bench.accuracy.record import record

    started = time.perf_counter()
    try:
        record(spec, Path(cache))
    except Exception as exc:  # one broken run must not stop the corpus; it is reported and retried next time
        return spec.run_id, time.perf_counter() - started, f"{type(exc).__name__}: {exc}"
    return spec.run_id, time.perf_counter() - started, None


def good_configs(cache: Path, split: str) -> dict[str, set[str]]:
    """family -> configuration keys with a clean run on the base seeds (dev's choice for the
    dev families; the held-out family's own test runs for it)."""
    out: dict[str, set[str]] = {}
    base = set(plan.SPLIT_SEEDS["dev"]) | set(plan.SPLIT_SEEDS["test"])
    for source in ("dev", split):
        for family, specs in labels.clean_twins(cache, source).items():
            if source == "dev" or family in plan.HELD_OUT_FAMILIES:
                keys = {plan.config_key(s.family, s.config) for s in specs if s.seed in base}
                out.setdefault(family, set()).update(keys)
    return out


def missing(specs: list[RunSpec], cache: Path) -> list[RunSpec]:
    return [s for s in specs if not (cache / "runs" / s.run_id / "run.json").is_file()]


def planned(split: str, cache: Path, phase: str, per_cell: int = 1) -> list[RunSpec]:
    if phase == "clean":
        return plan.clean_specs(split) + plan.extra_clean_specs(split, good_configs(cache, split))
    frozen = cache / f"plan-faults-{split}.json"
    stored: dict[str, RunSpec] = {}
    if frozen.is_file():
        stored = {s["run_id"]: RunSpec.from_json(s) for s in json.loads(frozen.read_text())}
    twins = labels.clean_twins(cache, split)
    if not twins:
        raise SystemExit(f"no clean runs of split {split!r} under {cache}: run the clean phase first")
    fresh = plan.fault_specs(split, twins, per_cell=per_cell)
    # the first plan of a run id wins: a later draw (more clean runs on disk) must not
    # change a run that may already be stored
    specs = [stored.get(s.run_id, s) for s in fresh]
    specs += [s for run_id, s in stored.items() if run_id not in {f.run_id for f in fresh}]
    frozen.write_text(json.dumps([s.to_json() for s in specs], indent=1))
    return specs


def run(specs: list[RunSpec], cache: Path, workers: int) -> list[tuple[str, str]]:
    todo = missing(specs, cache)
    print(f"{len(specs) - len(todo)} of {len(specs)} runs stored; training {len(todo)}", file=sys.stderr)
    failures: list[tuple[str, str]] = []
    if not todo:
        return failures
    # heavy families first: the pool's tail is then short runs
    order = {"transformer": 0, "resnet": 1, "cnn": 2, "lstm": 3, "tabular": 4, "xgboost": 5}
    todo.sort(key=lambda s: order.get(s.family, 9))
    items = [(s.to_json(), str(cache)) for s in todo]
    started = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, maxtasksperchild=20) as pool:
        for i, (run_id, seconds, error) in enumerate(pool.imap_unordered(_work, items), 1):
            status = "FAILED " + error if error else "ok"
            elapsed = time.perf_counter() - started
            print(
                f"[{i}/{len(items)}] {run_id} {seconds:.1f}s {status} (elapsed {elapsed:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
            if error:
                failures.append((run_id, error))
    return failures
