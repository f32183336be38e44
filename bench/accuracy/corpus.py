"""The corpus cache: stored runs, and jobs that emulate a save configuration from them.

Layout (under ``--cache``, default ``bench/out/accuracy-corpus``, gitignored)::

    runs/<run_id>/run.json          spec (cause) + outcome; written last: the run is complete
    runs/<run_id>/steps.jsonl.gz    every step the hook wrote: {"step", "wall_time", "modes"}
    runs/<run_id>/manifest.json     the hook's manifest
    runs/<run_id>/end.json          the hook's end marker
    runs/<run_id>/trace.json.gz     the bench's own signals (onset dating)
    runs/<run_id>/updates.json.gz   simulated update norms per emulated interval
    runs/<run_id>/labels.json       derived labels (``labels.py``; rewritten by every labelling)
    scores/<fingerprint>/<profile>/<run_id>.json   cached verdicts (``score.py``)

``read_job_folder`` reads what the hook wrote in either format (1: a step object per step;
2: segments) through the shared codec. ``EmulatedJob`` is a ``JobSource`` for
``trainguard.engine.replay``: the stored steps with only what a given save configuration
would have saved (each collection due on its own mode-step schedule), as format-1 step
objects, chained by ``prev_step`` like a real writer's.
"""

from __future__ import annotations

import functools
import gzip
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.engine.sources import LocalJob
from trainguard.format import stepfile
from trainguard.format.documents import decode_segment_header, decode_step_header
from trainguard.format.layout import ObjectKind, ObjectRef
from trainguard.hook.config import CollectionKeys, SaveConfig, default_collection
from trainguard.modes import ModeKeys

from bench.accuracy import plan


def write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, indent=1, sort_keys=True))


def write_json_gz(path: Path, doc: Any) -> None:
    with gzip.open(path, "wt", compresslevel=6) as fh:
        json.dump(doc, fh, separators=(",", ":"))


def read_json_gz(path: Path) -> Any:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


@dataclass
class StoredJob:
    format: int
    objects: int
    manifest: dict[str, Any]
    end: dict[str, Any]
    steps: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)


def read_job_folder(path: Path) -> StoredJob:
    """Every step one worker (0) wrote, from a format-1 or format-2 job folder."""
    source = LocalJob.open(path)
    manifest: dict[str, Any] = {}
    end: dict[str, Any] = {}
    steps: dict[int, dict[str, Any]] = {}
    warnings: list[str] = []
    fmt, objects = 1, 0
    for ref in source.objects():
        objects += 1
        if ref.kind is ObjectKind.MANIFEST:
            manifest = json.loads(source.document(ref))
        elif ref.kind is ObjectKind.END:
            end = json.loads(source.document(ref))
        elif ref.kind is ObjectKind.STEP:
            head, size = source.head(ref)
            header, _ = decode_step_header(head, object_size=size)
            doc = json.loads(header.model_dump_json())
            steps[header.step] = {"step": header.step, "wall_time": header.wall_time, "modes": doc["modes"]}
        elif ref.kind is ObjectKind.SEGMENT:
            fmt = 2
            raw = (source.root / _segment_path(ref)).read_bytes()
            segment, _ = decode_segment_header(raw, object_size=len(raw))
            for s in segment.steps:
                doc = json.loads(s.model_dump_json())
                steps[s.step] = {"step": s.step, "wall_time": s.wall_time, "modes": doc["modes"]}
            for reason, count in segment.dropped.items():
                warnings.append(f"segment {ref.seq}: {count} values dropped ({reason})")
    if not manifest or not end:
        found = f"manifest {'found' if manifest else 'missing'}, end marker {'found' if end else 'missing'}"
        warnings.append(f"job folder {path}: {found}")
    if end.get("dropped_objects"):
        warnings.append(f"the hook dropped {end['dropped_objects']} objects")
    return StoredJob(fmt, objects, manifest, end, [steps[k] for k in sorted(steps)], warnings)


def _segment_path(ref: ObjectRef) -> str:
    assert (
        ref.worker is not None and ref.seq is not None and ref.step is not None and ref.last_step is not None
    )
    return f"segments/worker-{ref.worker:05d}/{ref.seq:012d}-{ref.step:012d}-{ref.last_step:012d}.safetensors"


# ------------------------------------------------------------------------------ stored runs
@dataclass
class Run:
    """A complete stored run (lazy: the steps are read on first use)."""

    root: Path
    meta: dict[str, Any]
    _steps: list[dict[str, Any]] | None = None
    _trace: dict[str, Any] | None = None
    _updates: dict[str, Any] | None = None

    @property
    def run_id(self) -> str:
        return str(self.meta["spec"]["run_id"])

    @property
    def spec(self) -> plan.RunSpec:
        return plan.RunSpec.from_json(self.meta["spec"])

    @property
    def record_interval(self) -> int:
        """Every how many TRAIN steps the recording holds tensor statistics."""
        recorded = self.meta.get("recorded", {})
        if "train_record_interval" in recorded:
            return int(recorded["train_record_interval"])
        return 1 if self.spec.family == "xgboost" else plan.TRAIN_RECORD_INTERVAL

    @property
    def outcome(self) -> dict[str, Any]:
        return dict(self.meta["outcome"])

    def steps(self) -> list[dict[str, Any]]:
        if self._steps is None:
            with gzip.open(self.root / "steps.jsonl.gz", "rt") as fh:
                self._steps = [json.loads(line) for line in fh]
        return self._steps

    def trace(self) -> dict[str, Any]:
        if self._trace is None:
            self._trace = read_json_gz(self.root / "trace.json.gz")
        return self._trace

    def updates(self) -> dict[str, Any]:
        if self._updates is None:
            self._updates = read_json_gz(self.root / "updates.json.gz")
        return self._updates

    def manifest(self) -> dict[str, Any]:
        return json.loads((self.root / "manifest.json").read_text())  # type: ignore[no-any-return]

    def labels(self) -> dict[str, Any] | None:
        path = self.root / "labels.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def train_step_of(self) -> Callable[[int], int]:
        """Global step -> training step (TRAIN mode step at or before it)."""
        table: list[tuple[int, int]] = []
        last = 0
        for s in self.steps():
            train = s["modes"].get("TRAIN")
            if train is not None:
                last = int(train["mode_step"])
            table.append((int(s["step"]), last))
        steps = [g for g, _ in table]

        def convert(global_step: int) -> int:
            import bisect

            i = bisect.bisect_right(steps, global_step) - 1
            return table[i][1] if i >= 0 else 0

        return convert


def load_runs(cache: Path) -> list[Run]:
    out = []
    root = cache / "runs"
    if not root.is_dir():
        return out
    for path in sorted(root.iterdir()):
        meta = path / "run.json"
        if path.is_dir() and meta.is_file():
            out.append(Run(path, json.loads(meta.read_text())))
    return out


# ------------------------------------------------------------------------------ emulation
@dataclass(frozen=True, eq=False)
class SaveProfile:
    """A save configuration to emulate: each collection's schedule, as the hook would apply it."""

    name: str
    description: str
    #: collection -> its SaveConfig; None: the hook's built-in definition of that collection
    configs: dict[str, SaveConfig] | None = None

    def config(self, collection: str) -> SaveConfig:
        if self.configs is not None and collection in self.configs:
            return self.configs[collection]
        if self.configs is not None and "*" in self.configs:
            return self.configs["*"]
        built_in = default_collection(collection).save_config
        assert built_in is not None
        return built_in

    def due(self, collections: list[str], mode: str, mode_step: int) -> int | None:
        """The interval of the first collection due at this mode step, or None if none is."""
        return _due(self, tuple(collections), mode, mode_step)


@functools.lru_cache(maxsize=65536)
def _due(profile: SaveProfile, collections: tuple[str, ...], mode: str, mode_step: int) -> int | None:
    for name in collections:
        cfg = profile.config(name).get_save_config(ModeKeys(mode))
        if cfg.should_save(mode_step):
            return cfg.interval
    return None


def trainguard_default() -> SaveProfile:
    k = CollectionKeys
    scalar = default_collection(k.LOSSES).save_config
    tensor = default_collection(k.WEIGHTS).save_config
    assert scalar is not None and tensor is not None
    return SaveProfile(
        "trainguard",
        "trainguard's defaults, read from trainguard.hook.config: "
        f"losses, metrics and scalars every {scalar.get_save_config(ModeKeys.TRAIN).interval} step(s), "
        f"tensor statistics every {tensor.get_save_config(ModeKeys.TRAIN).interval} steps of each mode",
    )


def trainguard_eval_every_step() -> SaveProfile:
    """trainguard's defaults, except that every EVAL step is saved (labels, predictions...)."""
    from trainguard.hook.config import SaveConfigMode

    configs = {}
    for name in (*plan.RECORDED_COLLECTIONS, *CollectionKeys.SCALAR_COLLECTIONS):
        built_in = default_collection(name).save_config
        assert built_in is not None
        configs[name] = SaveConfig(
            mode_save_configs={
                ModeKeys.TRAIN: built_in.get_save_config(ModeKeys.TRAIN),
                ModeKeys.EVAL: SaveConfigMode(save_interval=1),
            }
        )
    return SaveProfile(
        "trainguard-eval1",
        "trainguard's defaults with every collection saved at every EVAL step (evaluations are a few "
        "batches; the rules that judge EVAL data need them); the recording simulates no weight-update "
        "norms for a 1-step interval, so EVAL tensors carry no update_l2 here (the rules that read it "
        "judge TRAIN updates)",
        configs,
    )


def sagemaker_default() -> SaveProfile:
    every = SaveConfig(save_interval=500)
    return SaveProfile(
        "sagemaker",
        "SageMaker Debugger's built-in-rule default: every collection, losses included, "
        "every 500 steps of each mode",
        {"*": every},
    )


#: tensors that hold what was added since the previous save, not a state (XGBoost's trees)
CUMULATIVE_PREFIXES = ("trees/",)


def merge_stats(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The statistics of the concatenation of tensors, from theirs (no values kept)."""
    if len(parts) == 1:
        return parts[0]
    n = sum(int(p["numel"]) for p in parts)
    if n == 0:
        return parts[-1]
    total = sum(float(p["mean"]) * int(p["numel"]) for p in parts)
    sq = sum(float(p["l2"]) ** 2 for p in parts)
    mean = total / n
    var = max(sq / n - mean * mean, 0.0)
    l1 = sum(float(p["l1"]) for p in parts)
    return {
        "numel": n,
        "mean": mean,
        "std": var**0.5,
        "min": min(float(p["min"]) for p in parts),
        "max": max(float(p["max"]) for p in parts),
        "mean_abs": l1 / n,
        "l1": l1,
        "l2": sq**0.5,
        "zeros": sum(int(p["zeros"]) for p in parts),
        "nan": sum(int(p["nan"]) for p in parts),
        "inf": sum(int(p["inf"]) for p in parts),
    }


class EmulationError(ValueError):
    """The stored recording cannot reproduce what the profile would have saved."""


class EmulatedJob:
    """A ``JobSource``: one stored run as the hook would have written it under ``profile``."""

    def __init__(self, run: Run, profile: SaveProfile, rules: list[dict[str, Any]] | None = None) -> None:
        self.run = run
        self.profile = profile
        self.job = run.run_id
        self.record_interval = run.record_interval
        manifest = run.manifest()
        if rules is not None:
            manifest["rules"] = rules
        self._manifest = json.dumps(manifest).encode()
        self._objects: dict[int, bytes] = {}
        self._refs: list[ObjectRef] = [ObjectRef(self.job, ObjectKind.MANIFEST)]
        updates = run.updates()
        #: EVAL/PREDICT tensors saved without update_l2 (an unsimulated interval)
        self.unsimulated_updates = 0
        #: (mode, name) -> stats of cumulative tensors recorded since the profile last saved them
        self._pending: dict[tuple[str, str], list[dict[str, Any]]] = {}
        prev: int | None = None
        for s in run.steps():
            modes = {}
            for mode, rec in s["modes"].items():
                kept = self._filter(mode, rec, updates)
                if kept is not None:
                    modes[mode] = kept
            if not modes:
                continue
            header = {
                "format": "trainguard.step/1",
                "job": self.job,
                "step": s["step"],
                "worker": 0,
                "world_size": 1,
                "prev_step": prev,
                "wall_time": s["wall_time"],
                "modes": modes,
            }
            self._objects[s["step"]] = stepfile.encode({}, {stepfile.METADATA_KEY: json.dumps(header)})
            self._refs.append(ObjectRef(self.job, ObjectKind.STEP, s["step"], 0))
            prev = s["step"]
        end = dict(json.loads((run.root / "end.json").read_text()))
        end.update({"last_step": prev, "steps_written": len(self._objects), "job": self.job})
        self._end = json.dumps(end).encode()
        self._refs.append(ObjectRef(self.job, ObjectKind.END, worker=0))

    def _filter(self, mode: str, rec: dict[str, Any], updates: dict[str, Any]) -> dict[str, Any] | None:
        m = int(rec["mode_step"])
        scalars = {
            n: v for n, v in rec.get("scalars", {}).items() if self.profile.due(v["collections"], mode, m)
        }
        tensors = {}
        for name, t in rec.get("tensors", {}).items():
            interval = self.profile.due(t["collections"], mode, m)
            if name.startswith(CUMULATIVE_PREFIXES) and t.get("stats") is not None:
                # "everything since the previous save" (XGBoost's new trees): a sparser
                # profile saves the union of the rounds it skipped
                pending = self._pending.setdefault((mode, name), [])
                pending.append(t["stats"])
                if interval is None:
                    continue
                t = {**t, "stats": merge_stats(pending), "shape": [sum(int(x["numel"]) for x in pending)]}
                self._pending[(mode, name)] = []
            if interval is None:
                continue
            stats = t.get("stats")
            if stats is not None and stats.get("update_l2") is not None:
                table = updates.get(str(interval))
                if table is None and mode == "TRAIN":
                    raise EmulationError(f"no simulated update norms for interval {interval}")
                if table is None:
                    # an EVAL/PREDICT schedule the recording did not simulate (every step):
                    # the statistic is left absent, as the hook leaves one it cannot compute,
                    # and counted
                    self.unsimulated_updates += 1
                    value = None
                else:
                    value = table.get(f"{mode}:{m}", {}).get(name)
                t = {**t, "stats": {**stats, "update_l2": value}}
            tensors[name] = t
        if mode == "TRAIN" and m % self.record_interval:
            # tensors were recorded only every TRAIN_RECORD_INTERVAL steps: refuse a profile
            # that wants one in between rather than silently leave it out
            for name in rec.get("tensors", {}):
                raise EmulationError(f"stored tensor {name} at an unrecorded TRAIN step {m}")
            if self._wants_unrecorded(m):
                raise EmulationError(
                    f"profile {self.profile.name} saves tensors at TRAIN step {m}, which the "
                    f"recording (every {self.record_interval}) does not hold"
                )
        if not scalars and not tensors:
            return None
        return {"mode_step": m, "scalars": scalars, "tensors": tensors}

    def _wants_unrecorded(self, mode_step: int) -> bool:
        return self.profile.due(list(plan.RECORDED_COLLECTIONS), "TRAIN", mode_step) is not None

    # JobSource
    def objects(self) -> Iterator[ObjectRef]:
        return iter(self._refs)

    def head(self, ref: ObjectRef) -> tuple[bytes, int]:
        assert ref.step is not None
        raw = self._objects[ref.step]
        return raw, len(raw)

    def document(self, ref: ObjectRef) -> bytes:
        if ref.kind is ObjectKind.MANIFEST:
            return self._manifest
        if ref.kind is ObjectKind.END:
            return self._end
        raise KeyError(ref)

    def sibling(self, name: str) -> EmulatedJob:
        raise KeyError(f"{name}: an emulated job has no sibling jobs (no cross-job rule is scored)")

    @property
    def saved_steps(self) -> int:
        return len(self._objects)
