"""``trainguard.Hook``: records what the rules need, one segment per worker per time window.

Mirrors smdebug's PyTorch hook, so migrating is an import change::

    hook = trainguard.Hook("s3://bucket/jobs/my-job", include_collections=["losses", "gradients"])
    hook.register_module(model)          # steps advance on each forward of ``model``
    hook.register_loss(criterion)        # losses saved from the criterion's output
    hook.set_mode(trainguard.modes.EVAL)

and works without a framework: every save call takes ``step=``::

    with trainguard.Hook("runs/my-job") as hook:
        for step in range(n):
            hook.save_scalar("loss", loss, step=step)          # a loss by its name
            hook.save_tensor("w", w, step=step, collections=["weights"])

Where the pieces are: step and mode bookkeeping in ``steps``, what statistics each tensor
gets in ``selection`` (from the configured rules' ``reads()``), the reductions in ``stats``,
accepted values and host copies in ``values``, segment windows in ``segments``, the
background writer in ``writer``, delivery (spill, retry, plain errors) in ``uploader``, stop
polling in ``stopping``, ``close()``'s report in ``reporting``, smdebug's methods and
``get_hook`` in ``smdebug``, SageMaker's hook configuration in ``sagemaker``. Framework
integrations (``torch_support``, ``xgboost_support``, the Hugging Face/Lightning/Keras
callbacks) use only the public recording interface below (``plan``, ``record_tensor(s)``,
``record_scalar``, ``collections_for``, ``check_stop``, ``guard``...; docs/hook.md shows an
example).

Explicit saves (``save_scalar``, ``save_tensor``, ``record_tensor_value``) are always
written, at any step: save configs throttle only what the hook captures by itself. A scalar
saved without collections goes to ``losses`` when its name says it is a loss (smdebug's
losses regex, ``Loss``, ``loss`` as a word), else to ``scalars``.

Never breaking the job: an internal error is logged once, with its traceback, and the
hook disables itself (every later call is a no-op); a bad argument (name, dtype, step) is
logged once and that value skipped, and counted. Nothing is dropped without being counted
by reason: the counts go into each segment, the end marker and ``close()``'s report. The one
exception the hook raises into the training loop is ``StopTrainingRequested``, and only if
``raise_on_stop`` (the default: a rule with the StopTraining action asked for it), once, at a
safe point (the top module's forward pre-hook, ``advance_step``/``set_step`` or a save call).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import platform
import socket
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar

import numpy as np

from trainguard.format import layout, stepfile
from trainguard.format.documents import (
    MAX_STRUCTURE_CHARS,
    MAX_STRUCTURE_TENSORS,
    EndMarker,
    FrameworkInfo,
    Manifest,
    ManifestCollection,
    ManifestSaveConfig,
    ModelStructure,
    StopSignal,
    TensorStats,
    dump_document,
)
from trainguard.hook import env
from trainguard.hook.config import (
    DEFAULT_TENSOR_INTERVAL,
    Collection,
    CollectionKeys,
    SaveConfig,
    build_collections,
    default_collection,
    is_loss_name,
)
from trainguard.hook.cost import CostMeter, HookCost
from trainguard.hook.reporting import HookReport, announce
from trainguard.hook.segments import ModeBuffer, PendingTensor, SegmentBuilder, StepRecord
from trainguard.hook.selection import FeedCheck, StatisticsPlan, TensorChoice, declarations
from trainguard.hook.smdebug import (
    SmdebugMethods,
    constructor_notes,
    del_hook,
    forget_current,
    get_hook,
    reduction_statistics,
    set_current,
)
from trainguard.hook.stats import PendingStats, numpy_stats, torch_stats, torch_stats_many
from trainguard.hook.steps import StepBook, StepPlan, check_step, parse_mode
from trainguard.hook.stopping import StopTrainingRequested, StopWatcher
from trainguard.hook.storage import Store, open_store
from trainguard.hook.uploader import Delivery, DeliveryReport, UploadStats
from trainguard.hook.values import (
    TORCH_STORABLE,
    host_copy,
    is_torch,
    nbytes,
    numpy_storable,
    search,
    to_scalar,
)
from trainguard.hook.writer import DropCounter, SegmentWriter
from trainguard.modes import ModeKeys
from trainguard.version import __version__

log = logging.getLogger("trainguard.hook")

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_STOP_CHECK_INTERVAL_S = 5.0
DEFAULT_FLUSH_TIMEOUT_S = 30.0
#: A segment window's length, chosen by measurement (``bench/hook_writer.py``): a 2 s window of
#: a 15 ms-step job (133 steps) costs the training process ~2.4 ms of CPU to encode and ~1.5 ms
#: to deliver through the S3 client (~0.2% of a core), and 2 s keeps the service's cost (~$10
#: per million objects) at $0.018 per worker-hour at any step rate, under the $0.02 goal (1 s:
#: $0.036). A non-finite value closes its window at once, so a diverging job is judged at once.
DEFAULT_WINDOW_S = 2.0
MIN_WINDOW_S, MAX_WINDOW_S = 0.2, 60.0
#: collections on when the hook is created without ``include_collections``: the scalars,
#: plus what the configured rules read (``selection``)
DEFAULT_SCALAR_COLLECTIONS = (CollectionKeys.LOSSES, CollectionKeys.METRICS, CollectionKeys.SCALARS)


def _guarded(default: Any = None) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run a hook entry point; an internal error disables the hook instead of raising."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def inner(*args: P.args, **kwargs: P.kwargs) -> R:
            self = args[0]
            assert isinstance(self, Hook)
            return self._run_guarded(fn, fn.__name__, default, args, kwargs)  # type: ignore[no-any-return]

        return inner

    return wrap


class Hook(SmdebugMethods):
    """Records losses, metrics and the tensor statistics trainguard's rules read.

    Parameters
    ----------
    out_dir
        The job folder: ``s3://bucket/prefix/<job>`` or a local directory (same layout).
        None: ``TRAINGUARD_OUT_DIR``, else on SageMaker the job's ``DebugHookConfig``
        (``S3OutputPath``/``TRAINING_JOB_NAME``), else a ``ValueError`` naming both.
    save_config
        Applies to every collection not given its own (smdebug's precedence). Default:
        scalars every step, tensor statistics every ``DEFAULT_TENSOR_INTERVAL`` steps.
    include_collections
        Collections to save (``CollectionKeys``). Default: ``losses``, ``metrics``,
        ``scalars`` and the collections the configured rules read.
    include_regex
        Extra tensors to save, by name (smdebug's: ``Net_fc1.weight``,
        ``gradient/Net_fc1.weight``, ``fc1_output_0``), into ``default``.
    save_all
        smdebug's ``save_all``: every parameter, gradient and module input/output, in ``all``.
    collections
        ``Collection`` objects that add to or replace the built-in definitions, e.g. full
        gradients every 10 steps:
        ``Collection("gradients", SaveConfig(save_interval=10), save_full=True)``.
    rules
        SageMaker rule entries in any shape the SDK writes (a list, an object with
        ``DebugRuleConfigurations``/``ProfilerRuleConfigurations``, a whole
        ``CreateTrainingJob`` request), written to the manifest; None: the service's
        default rules. The hook records what these rules read (``Rule.reads()``).
    statistics
        ``"rules"``: each tensor gets what the configured rules read, plus the standard set
        for collections you included explicitly; ``"all"``: every statistic.
    window_s
        Length of a segment window, 0.2 to 60 s (one object per worker per window).
    job_name
        Default: the last component of ``out_dir``.
    sagemaker_stop
        Opt in to being stopped with SageMaker's StopTrainingJob (manifest.allow_sagemaker_stop).
    raise_on_stop
        Raise ``StopTrainingRequested`` at the next step boundary once the service asks the
        job to stop. Default True: the stop signal exists only when the user gave a rule the
        StopTraining action, so the job should stop even without code that polls
        ``hook.should_stop``; catch the exception to checkpoint first.
    stop_check_interval_s
        How often a background thread looks for ``control/stop.json`` (0 disables).
    flush_timeout_s
        How long ``close()`` waits for the writer to deliver what is queued.
    max_buffer_bytes
        Memory for records waiting to be encoded; when full, a save waits (backpressure).
    profiler
        Profile the job: True samples the host every 0.5 s (a float: that interval, 0.1 to
        60 s) and records step timings; batches are written every ``profiler_flush_s``
        seconds (``system/worker-<rank>/<seq>.json``), for the profiler rules and the report.
        Wrap the data loader with ``hook.timed_loader(loader)`` to time data waits.
    sample_system
        With several ranks per host, pass False on all but one: the others still send their
        step timings.

    smdebug's ``export_tensorboard``, ``tensorboard_dir``, ``reduction_config``,
    ``include_workers`` and ``dry_run`` are accepted (see docs/hook.md for what each does here).
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | None = None,
        save_config: SaveConfig | None = None,
        include_collections: Iterable[str] | None = None,
        include_regex: Sequence[str] | None = None,
        *,
        save_all: bool = False,
        collections: Iterable[Collection] | None = None,
        rules: list[dict[str, Any]] | Mapping[str, Any] | None = None,
        statistics: Literal["rules", "all"] = "rules",
        window_s: float = DEFAULT_WINDOW_S,
        job_name: str | None = None,
        sagemaker_stop: bool = False,
        raise_on_stop: bool = True,
        stop_check_interval_s: float = DEFAULT_STOP_CHECK_INTERVAL_S,
        flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S,
        max_buffer_bytes: int = 128 * 1024 * 1024,
        spill_dir: str | os.PathLike[str] | None = None,
        store: Store | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        profiler: bool | float = False,
        sample_system: bool = True,
        profiler_flush_s: float = 10.0,
        export_tensorboard: bool = False,
        tensorboard_dir: str | None = None,
        reduction_config: Any = None,
        include_workers: str | None = None,
        dry_run: bool = False,
    ) -> None:
        detected_job: str | None = None
        if out_dir is None:
            if store is not None:
                out_dir = store.url
            else:
                out_dir, detected_job = env.resolve_out_dir()
        self.out_dir = os.fspath(out_dir)
        name = job_name or detected_job or self.out_dir.rstrip("/").rsplit("/", 1)[-1]
        self.job_name = layout.validate_job_name(name)
        if statistics not in ("rules", "all"):
            raise ValueError(f"statistics must be 'rules' or 'all', got {statistics!r}")
        if not MIN_WINDOW_S <= float(window_s) <= MAX_WINDOW_S:
            raise ValueError(f"window_s must be between {MIN_WINDOW_S} and {MAX_WINDOW_S} seconds")
        # any shape the SageMaker SDK writes (a list of entries, Debug/ProfilerRuleConfigurations,
        # a CreateTrainingJob request): the same normalisation the service and replay use
        self.rules = _normalized_rules(rules)
        detected_rank, detected_world = env.rank_and_world()
        self.rank = detected_rank if rank is None else rank
        self.world_size = detected_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")
        self.sagemaker_stop = sagemaker_stop
        self.raise_on_stop = raise_on_stop
        self.flush_timeout_s = flush_timeout_s
        self.window_s = float(window_s)
        self.save_all = bool(save_all)
        self.dry_run = bool(dry_run)
        self._notes = constructor_notes(export_tensorboard, tensorboard_dir, include_workers)
        user_statistics = reduction_statistics(reduction_config)

        # What to record: the configured rules' declarations, then the collections
        self._reads, self._rule_problems = declarations(_parse_rules(self.rules))
        explicit = set(include_collections or ()) | {c.name for c in collections or ()}
        if include_regex:
            explicit.add(CollectionKeys.DEFAULT)
        self.selection = StatisticsPlan(self._reads, explicit=explicit, everything=statistics == "all")
        base = (
            list(include_collections)
            if include_collections is not None
            else [*DEFAULT_SCALAR_COLLECTIONS, *sorted(self.selection.required_collections())]
        )
        if include_collections is not None:
            base += sorted(self.selection.required_collections() - set(base))
        regex = list(include_regex or ()) + [
            r for r in self.selection.extra_regexes() if r not in (include_regex or ())
        ]
        self.collections: dict[str, Collection] = build_collections(
            base, regex or None, save_config, collections
        )
        if self.save_all:
            every = self.collections.get(CollectionKeys.ALL) or default_collection(CollectionKeys.ALL)
            every.include(".*")
            every.save_full = True  # smdebug's save_all saves every tensor in full
            if save_config is not None and CollectionKeys.ALL not in {c.name for c in collections or ()}:
                every.save_config = save_config
            elif every.save_config is None:
                every.save_config = SaveConfig(save_interval=DEFAULT_TENSOR_INTERVAL)
            self.collections[CollectionKeys.ALL] = every
            explicit.add(CollectionKeys.ALL)
        if user_statistics is not None:
            for col in self.collections.values():
                if col.statistics is None and col.name not in CollectionKeys.SCALAR_COLLECTIONS:
                    col.statistics = user_statistics
        self.include_regex = list(regex)
        self._explicit = explicit

        # Where it goes
        self._store = store or open_store(self.out_dir)
        spill = Path(spill_dir) if spill_dir else Path(tempfile.gettempdir()) / "trainguard-spill"
        self.spill_dir = spill / f"{self.job_name}-worker{self.rank:05d}-{os.getpid()}"
        self._drops = DropCounter()
        #: tensor name -> position: parameters and their gradients are written in the
        #: model's parameter order (rules such as GradientNormRatio rely on it)
        self._order: dict[str, int] = {}
        self._builder = SegmentBuilder(
            self.job_name,
            self.rank,
            self.world_size,
            window_s=self.window_s,
            order=self._order,
            take_dropped=self._drops.take_new,
        )
        self._delivery = Delivery(self._store, spill_dir=self.spill_dir)
        self._writer = SegmentWriter(
            self._builder,
            self._delivery,
            self._drops,
            max_bytes=max_buffer_bytes,
            on_error=self._writer_error,
        )

        # State of the training thread
        self._lock = threading.RLock()
        self._book = StepBook(self.collections, self._seal)
        self._record: StepRecord | None = None
        self._warned: set[str] = set()
        self._disabled = self.dry_run
        self._cost = CostMeter()
        self._closed = False
        self._report: HookReport | None = None
        self._manifest_sent = False
        #: the model's structure (``set_structure``): parameter name -> kind, and how many
        #: entries did not fit the manifest's bound
        self._structure: dict[str, str] = {}
        self._structure_chars = 0
        self._structure_omitted = 0
        self._first_step_checked = False
        self._frameworks: dict[str, str | None] = {}
        self._producers: dict[str, set[str]] = {}
        self._received: set[str] = set()
        self._coverage = FeedCheck(self._reads, self._rule_problems)
        self._torch: Any = None  # the TorchIntegration, once a module is registered
        #: previous saved copy per (mode, tensor), for ``update_l2``: an update is measured
        #: between two saves of the same mode (an EVAL save of the weights holds the same
        #: values as the next TRAIN save, and would make that update look like zero)
        self._previous: dict[tuple[str, str], Any] = {}
        self._regex_cache: dict[tuple[str, tuple[str, ...], tuple[str, ...]], tuple[str, ...]] = {}
        self._stop_raised = False
        self._stop = StopWatcher(self._store, self.job_name, stop_check_interval_s or 0.0)

        # Profiling: a background system monitor and the step timings (trainguard.profiling)
        self._monitor: Any = None
        self._system_batches = 0
        self._timed_step: tuple[ModeKeys, int] | None = None
        if profiler:
            from trainguard.profiling import SystemMonitor

            interval = 0.5 if profiler is True else float(profiler)
            self._monitor = SystemMonitor(
                self._emit_system,
                self.job_name,
                worker=self.rank,
                world_size=self.world_size,
                interval_s=interval,
                flush_s=profiler_flush_s,
                sample_system=sample_system,
            ).start()
        set_current(self)
        atexit.register(_close_at_exit, weakref.ref(self))
        for note in self._notes:
            log.info("trainguard: %s", note)
        if self.dry_run:
            log.warning("trainguard: dry_run=True: the hook records and writes nothing")

    # ------------------------------------------------------------------ public state
    @property
    def disabled(self) -> bool:
        """True once an internal error switched the hook off (or with ``dry_run``)."""
        return self._disabled

    @property
    def should_stop(self) -> bool:
        """True once the service wrote this job's stop signal (checked in the background)."""
        return self._stop.requested.is_set()

    @property
    def stop_signal(self) -> StopSignal | None:
        return self._stop.signal

    @property
    def step(self) -> int:
        """The current global step."""
        return self._book.step

    @property
    def mode(self) -> ModeKeys:
        return self._book.mode

    def cost(self) -> HookCost:
        """The hook's own cost so far, measured in this process (``trainguard.hook.cost``):
        time the training thread spent inside the hook, CPU time of the hook's threads."""
        return self._cost.read()

    @property
    def upload_stats(self) -> UploadStats:
        return self._delivery.stats

    @property
    def dropped(self) -> dict[str, int]:
        """Values not recorded so far, by reason."""
        return self._drops.totals()

    @property
    def store(self) -> Store:
        return self._store

    @property
    def segments_written(self) -> int:
        return self._writer.segments

    def get_collection(self, name: str) -> Collection:
        """A collection's definition (created with defaults if new); edit it before the first step."""
        col = self.collections.get(name)
        if col is None:
            col = build_collections([name], None, None, None)[name]
            self.collections[name] = col
            self.collections_changed()
        return col

    def collections_changed(self) -> None:
        """Collections were edited (e.g. ``add_module_tensors`` resolved): forget cached matches."""
        self._book.collections_changed()
        self._regex_cache.clear()

    # ------------------------------------------------------------------ steps and modes
    @_guarded()
    def set_mode(self, mode: ModeKeys | str) -> None:
        """Switch mode (TRAIN, EVAL, PREDICT, GLOBAL). The global step is not advanced."""
        try:
            new = parse_mode(mode)
        except ValueError:
            self.warn_once(f"mode:{mode}", "ignoring set_mode(%r): not a trainguard mode", mode)
            return
        with self._lock:
            self._book.set_mode(new)

    @_guarded()
    def advance_step(self) -> None:
        """End the current step: its record is handed to the writer and the counter moves on."""
        self.check_stop()
        with self._lock:
            self._book.advance()
            self._time_step()

    @_guarded()
    def set_step(self, step: int) -> None:
        """Make ``step`` the current global step (the current one is sealed if different)."""
        self.check_stop()
        try:
            value = check_step(step)
        except ValueError as exc:
            self.warn_once(f"arg:{exc}", "ignoring set_step: %s", exc)
            return
        with self._lock:
            self._book.move_to(value)
            self._time_step()

    # ------------------------------------------------------------------ explicit saves
    @_guarded(default=False)
    def save_scalar(
        self,
        name: str,
        value: Any,
        step: int | None = None,
        collections: Sequence[str] | None = None,
        *,
        mode: ModeKeys | str | None = None,
        sm_metric: bool = False,
        timestamp: float | None = None,
    ) -> bool:
        """Save a scalar (loss, metric...). Always written; returns False only if it could not be.

        Collections: ``collections`` if given; else ``losses`` when the name says it is a loss
        (``loss``, ``val_loss``, ``CrossEntropyLoss_output_0``), else ``scalars``. smdebug's
        ``sm_metric``/``timestamp`` are accepted (a positional ``True`` in ``step``'s place is
        smdebug's ``sm_metric``).
        """
        if isinstance(step, bool):  # smdebug: save_scalar(name, value, sm_metric)
            step = None
        self.check_stop()
        if not self._valid_name(name):
            return False
        cols = list(collections) if collections else [_scalar_collection(name)]
        with self._lock:
            plan = self._enter_user(step, mode)
            if plan is None:
                return False
            try:
                scalar = to_scalar(value)
            except (TypeError, ValueError) as exc:
                self._drop("not_a_scalar", f"scalar:{name}", "skipping scalar %r: %s", name, exc)
                return False
            for c in cols:
                self.get_collection(c)
            self._buffer(plan).scalars[name] = (scalar, cols)
            self._received.update(cols)
            self._note_record(64)
            return True

    @_guarded(default=False)
    def save_tensor(
        self,
        name: str,
        value: Any,
        collections: Sequence[str] | str | None = None,
        step: int | None = None,
        *,
        mode: ModeKeys | str | None = None,
        full: bool = True,
        collections_to_write: Sequence[str] | str | None = None,
    ) -> bool:
        """Save a tensor: its full value (as smdebug does) and its statistics. Always written.

        ``value``: a numpy array, a torch tensor (reduced on its device) or anything
        ``np.asarray`` accepts (JAX arrays). ``collections`` (smdebug: ``collections_to_write``;
        default ``default``) say which rules see it and which statistics it gets (what the
        configured rules read, plus the standard set). ``full=False`` keeps only the
        statistics, except at steps where a ``save_full`` collection of it is due. Returns False
        only if it could not be recorded (counted and logged).
        """
        self.check_stop()
        chosen = collections if collections is not None else collections_to_write
        if isinstance(chosen, str):
            chosen = [chosen]
        names = list(chosen) if chosen else [CollectionKeys.DEFAULT]
        if not self._valid_name(name):
            return False
        with self._lock:
            plan = self._enter_user(step, mode)
            if plan is None:
                return False
            cols = [self.get_collection(c) for c in names]
            choice = self.selection.choose(name, cols, plan.mode.value, explicit_save=True)
            # a save_full collection that is due stores the tensor even when full=False
            due_full = any(c.save_full and c.name in plan.due for c in cols)
            return self._record_tensor(
                plan, name, value, cols, choice, full=full or due_full, due_full=due_full
            )

    # ------------------------------------------------------------------ the public recording interface
    def plan(self, step: int | None = None, mode: ModeKeys | str | None = None) -> StepPlan | None:
        """Make (step, mode) current and say what is due there (the recording interface).

        ``step`` None: the hook's counter. None is returned when nothing can be recorded
        (the hook is disabled or closed, or the step was already written).
        """
        if self._disabled or self._closed:
            return None
        try:
            m = None if mode is None else parse_mode(mode)
            s = None if step is None else check_step(step)
            with self._lock:
                plan = self._book.enter(s, m)
                if plan is not None:
                    self._entered(plan)
                return plan
        except StopTrainingRequested:
            raise
        except ValueError as exc:
            self.warn_once(f"arg:{exc}", "ignoring a step: %s", exc)
            return None
        except Exception as exc:
            self._disable(exc, where="plan")
            return None

    def check_stop(self) -> None:
        """A safe point: raise ``StopTrainingRequested`` once when a stop was requested."""
        if self.raise_on_stop and not self._stop_raised and self._stop.requested.is_set():
            self._stop_raised = True
            raise StopTrainingRequested(self._stop.signal)

    def record_tensor(self, name: str, value: Any, collections: Sequence[str]) -> bool:
        """Record a tensor an integration captured at the current step, if a collection is due.

        Throttled by the save configs (unlike ``save_tensor``): recorded only when one of
        ``collections`` is due at the current step; its statistics are what the selection
        chooses; its full value only when a due collection has ``save_full``.
        """
        return self.record_tensors([(name, value, collections)]) == 1

    def record_tensors(self, items: Iterable[tuple[str, Any, Sequence[str]]]) -> int:
        """``record_tensor`` for many tensors at once (reduced together: one host copy on an
        accelerator, ``_foreach`` kernels where they apply). Returns how many were recorded."""
        if self._disabled:
            return 0
        try:
            with self._lock:
                plan = self._book.current or self._book.enter()
                if plan is None or not plan.due:
                    return 0
                self._entered(plan)
                batch: list[tuple[str, Any, list[Collection], TensorChoice, bool]] = []
                for name, value, names in items:
                    due = [c for c in names if c in plan.due]
                    if not due:
                        continue
                    cols = [self.collections[c] for c in due if c in self.collections]
                    choice = self.selection.choose(name, cols, plan.mode.value)
                    full = any(c.save_full for c in cols)
                    if choice.empty and not full:
                        continue
                    batch.append((name, value, cols, choice, full))
                return self._record_batch(plan, batch)
        except StopTrainingRequested:
            raise
        except Exception as exc:
            self._disable(exc, where="record_tensors")
            return 0

    def record_scalar(self, name: str, value: Any, collections: Sequence[str]) -> bool:
        """Record a scalar an integration captured (a loss module's output), if a collection is due."""
        if self._disabled:
            return False
        try:
            with self._lock:
                plan = self._book.current or self._book.enter()
                if plan is None:
                    return False
                self._entered(plan)
                due = [c for c in collections if c in plan.due]
                if not due:
                    return False
                try:
                    scalar = to_scalar(value)
                except (TypeError, ValueError) as exc:
                    self._drop("not_a_scalar", f"scalar:{name}", "skipping scalar %r: %s", name, exc)
                    return False
                self._buffer(plan).scalars[name] = (scalar, due)
                self._received.update(due)
                self._note_record(64)
                return True
        except Exception as exc:
            self._disable(exc, where="record_scalar")
            return False

    def collections_for(
        self, name: str, base: Sequence[str] = (), *, aliases: Sequence[str] = ()
    ) -> tuple[str, ...]:
        """``base`` plus every collection whose ``include_regex`` (``re.search``, as smdebug) or
        ``tensor_names`` takes ``name`` or one of its ``aliases`` (a parameter's name without
        smdebug's model prefix); cached: edit collections before the first step."""
        key = (name, tuple(base), tuple(aliases))
        cached = self._regex_cache.get(key)
        if cached is None:
            names = (name, *aliases)
            out = list(base)
            for col in self.collections.values():
                if col.name in out:
                    continue
                if any(n in col.tensor_names for n in names) or any(
                    search(r, n) for r in col.include_regex for n in names
                ):
                    out.append(col.name)
            cached = tuple(out)
            if len(self._regex_cache) < 100_000:
                self._regex_cache[key] = cached
        return cached

    def add_framework(self, name: str, version: str | None, *, produces: Iterable[str] = ()) -> None:
        """An integration announces itself: named in the manifest; ``produces`` lists the
        collections it can capture (the hook warns at the first step about what a configured
        rule reads and no integration produces)."""
        self._frameworks[name] = version
        self._producers.setdefault(name, set()).update(produces)

    def set_structure(self, tensors: Mapping[str, str]) -> None:
        """An integration's knowledge of the model's build (``ModelStructure``: parameter name
        -> kind): written in the manifest. Entries are only added; when the manifest was
        already written (what a backward teaches comes after the first step), it is written
        again, and the service adds the new entries to the job's."""
        with self._lock:
            added = False
            for name, kind in tensors.items():
                if name in self._structure or not (isinstance(name, str) and 0 < len(name) <= 512):
                    continue
                size = len(name) + len(kind)
                if len(self._structure) >= MAX_STRUCTURE_TENSORS or self._structure_chars + size > (
                    MAX_STRUCTURE_CHARS
                ):
                    self._structure_omitted += 1
                    continue
                self._structure[name] = kind[:256]
                self._structure_chars += size
                added = True
            if added and self._manifest_sent and not self._closed:
                self._send_manifest()

    def set_tensor_order(self, names: Sequence[str]) -> None:
        """Tensors are written in this order (a model's parameters, then anything else)."""
        with self._lock:
            for name in names:
                self._order.setdefault(name, len(self._order))

    def guard(self, fn: Callable[..., Any], where: str) -> Callable[..., Any]:
        """Wrap an integration callback: an error disables the hook (logged once, with its
        traceback) instead of reaching the training loop; ``StopTrainingRequested`` passes."""

        def inner(*args: Any, **kwargs: Any) -> Any:
            return self._run_guarded(fn, where, None, args, kwargs)

        return inner

    def _run_guarded(
        self, fn: Callable[..., Any], where: str, default: Any, args: Any, kwargs: dict[str, Any]
    ) -> Any:
        """Every entry point (public method or integration callback) runs through here: timed
        for ``cost()`` (outermost call only), and an internal error disables the hook."""
        if self._disabled:
            return default
        timed = self._cost.enter()
        try:
            return fn(*args, **kwargs)
        except StopTrainingRequested:
            raise
        except Exception as exc:
            self._disable(exc, where=where)
            return default
        finally:
            if timed:
                self._cost.exit()

    # ------------------------------------------------------------------ recording (lock held)
    def _enter_user(self, step: Any, mode: Any) -> StepPlan | None:
        """Enter a step for a user's explicit save; a bad or old step is counted and skipped."""
        if self._closed:
            self._drop("after_close", "closed", "ignoring a save after close(): the job's data is final")
            return None
        try:
            s = None if step is None else check_step(step)
            m = None if mode is None else parse_mode(mode)
        except ValueError as exc:
            self._drop("bad_argument", f"arg:{exc}", "ignoring a save call: %s", exc)
            return None
        plan = self._book.enter(s, m)
        if plan is None:
            self._drop(
                "step_already_written",
                f"old:{self._book.step}",
                "ignoring saves for step %d: step %d was already written (steps must increase)",
                self._book.step,
                self._book.sealed_step,
            )
            return None
        self._entered(plan)
        return plan

    def _entered(self, plan: StepPlan) -> None:
        if not self._manifest_sent:
            self._send_manifest()
        if not self._first_step_checked:
            self._first_step_checked = True
            self._check_inputs()
        if self._monitor is not None:
            self._time_step()

    def _buffer(self, plan: StepPlan) -> ModeBuffer:
        record = self._record
        if record is None or record.step != plan.step:
            record = self._record = StepRecord(plan.step, time.time())
        buf = record.modes.get(plan.mode.value)
        if buf is None:
            buf = record.modes[plan.mode.value] = ModeBuffer(plan.mode_step)
        return buf

    def _note_record(self, nbytes: int) -> None:
        if self._record is not None:
            self._record.nbytes += nbytes

    def _record_batch(
        self, plan: StepPlan, batch: list[tuple[str, Any, list[Collection], TensorChoice, bool]]
    ) -> int:
        torch_items = [i for i, b in enumerate(batch) if is_torch(b[1])]
        if len(torch_items) > 1:
            pending = torch_stats_many(
                [batch[i][1] for i in torch_items],
                [None if batch[i][3].spec.is_empty() else batch[i][3].spec for i in torch_items],
            )
            # by position, not id(value): one tensor may be recorded under two names with
            # different statistics (an in-place ReLU's output is also its input object)
            pre = dict(zip(torch_items, pending, strict=True))
        else:
            pre = {}
        done = 0
        for index, (name, value, cols, choice, full) in enumerate(batch):
            if self._record_tensor(
                plan, name, value, cols, choice, full=full, due_full=full, stats=pre.get(index)
            ):
                done += 1
        return done

    def _record_tensor(
        self,
        plan: StepPlan,
        name: str,
        value: Any,
        cols: list[Collection],
        choice: TensorChoice,
        *,
        full: bool,
        due_full: bool,
        stats: PendingStats | TensorStats | None = None,
    ) -> bool:
        """Reduce (and copy, if asked) one tensor into the current step's record."""
        torch_value = is_torch(value)
        spec = choice.spec
        copy: Any = None
        try:
            if torch_value:
                dtype = str(value.dtype).removeprefix("torch.")
                shape = [int(d) for d in value.shape]
                if stats is None and not spec.is_empty():
                    stats = torch_stats(value, spec)
                if full:
                    if dtype in TORCH_STORABLE:
                        copy = host_copy(value)
                    else:
                        self._drop(
                            "dtype_not_storable",
                            f"dtype:{name}",
                            "cannot store tensor %r of dtype %s in full; statistics only",
                            name,
                            dtype,
                        )
            else:
                array = np.asarray(value)
                dtype, shape = array.dtype.name, [int(d) for d in array.shape]
                if stats is None and not spec.is_empty():
                    stats = numpy_stats(array, spec)
                if full:
                    if numpy_storable(array.dtype):
                        copy = np.array(array, copy=True)
                    else:
                        self._drop(
                            "dtype_not_storable",
                            f"dtype:{name}",
                            "cannot store tensor %r of dtype %s in full; statistics only",
                            name,
                            dtype,
                        )
        except TypeError as exc:
            self._drop("unsupported_value", f"type:{name}", "skipping tensor %r: %s", name, exc)
            return False
        if len(shape) > stepfile.MAX_NDIM:
            self._drop(
                "too_many_dimensions",
                f"ndim:{name}",
                "skipping tensor %r: more than %d dimensions",
                name,
                stepfile.MAX_NDIM,
            )
            return False
        if choice.update_norm and stats is not None:
            stats = self._with_update_norm((plan.mode.value, name), value, stats, torch_value)
        buf = self._buffer(plan)
        buf.tensors[name] = PendingTensor([c.name for c in cols], dtype, shape, stats, copy)
        assert self._record is not None
        self._record.nbytes += 512 + nbytes(copy)
        if due_full and copy is not None:
            self._record.full_due = True
        self._received.update(c.name for c in cols)
        return True

    def _with_update_norm(
        self, key: tuple[str, str], value: Any, stats: PendingStats | TensorStats, is_torch: bool
    ) -> PendingStats | TensorStats:
        """Attach ``update_l2`` = ||value - previous save of the tensor in the same mode||
        (None on the first save in that mode); ``key`` is (mode, name)."""
        prev = self._previous.get(key)
        update: Any = None
        if is_torch:
            import torch

            cur = value.detach()
            if (
                prev is not None
                and prev.shape == cur.shape
                and prev.device == cur.device
                and prev.dtype == cur.dtype
            ):
                diff = torch.linalg.vector_norm((cur - prev).double())
                update = float(diff) if cur.device.type == "cpu" else diff
                prev.copy_(cur)
            else:
                self._previous[key] = cur.clone()
        else:
            cur_np = np.asarray(value)
            if prev is not None and getattr(prev, "shape", None) == cur_np.shape:
                update = float(np.linalg.norm((cur_np.astype(np.float64) - prev).ravel()))
            self._previous[key] = cur_np.astype(np.float64, copy=True)
        if update is None:
            return stats
        if isinstance(stats, PendingStats):
            stats.update_l2 = update
            return stats
        return stats.model_copy(update={"update_l2": float(update)})

    def _seal(self, _step: int) -> None:
        """Hand the current step's record to the writer (the book is leaving that step)."""
        record, self._record = self._record, None
        if record is None:
            return
        self._book.sealed_step = record.step
        self._writer.submit(record)

    def _drop(self, reason: str, key: str, message: str, *args: Any) -> None:
        self._drops.add(reason)
        self.warn_once(key, message + " (counted as dropped: %s)", *args, reason)

    # ------------------------------------------------------------------ can the rules be fed?
    def _check_inputs(self) -> None:
        self._coverage.first_step(self._producers)

    def _check_received(self) -> None:
        if not self._disabled:
            self._coverage.at_close(self._received)

    # ------------------------------------------------------------------ framework integration
    @_guarded()
    def register_module(self, module: Any) -> None:
        """Hook a PyTorch module: steps advance on each of its forwards; weights, gradients and
        activations are recorded per the collections (see ``trainguard.hook.torch_support``)."""
        self._torch_integration().register_module(module)

    @_guarded()
    def register_loss(self, loss_module: Any) -> None:
        """Record a loss module's output (``losses``) and, when included, its inputs
        (``predictions``, ``labels``) on each call."""
        self._torch_integration().register_loss(loss_module)

    def _torch_integration(self) -> Any:
        if self._torch is None:
            from trainguard.hook.torch_support import TorchIntegration

            self._torch = TorchIntegration(self)
        return self._torch

    # ------------------------------------------------------------------ profiling
    def timed_loader(self, iterable: Any) -> Any:
        """Wrap a DataLoader (any iterable): time spent waiting for the next batch is recorded.

        Without ``profiler=`` it returns ``iterable`` unchanged.
        """
        return self._monitor.timed_loader(iterable) if self._monitor is not None else iterable

    def _emit_system(self, key: str, data: bytes) -> None:
        """The monitor's batches go through the same writer and delivery (spill, retry)."""
        self._system_batches += 1
        self._writer.submit_raw(key, data)

    def _time_step(self) -> None:
        """A step boundary for the profiler's step timings (caller holds the lock)."""
        monitor = self._monitor
        if monitor is None:
            return
        current = (self._book.mode, self._book.step)
        if self._timed_step == current:
            return
        if self._timed_step is None:
            monitor.mark_initialized()
        else:
            monitor.step_ended(self._timed_step[0].value, self._timed_step[1])
        monitor.step_started(self._book.mode.value, self._book.step)
        self._timed_step = current

    # ------------------------------------------------------------------ manifest
    def _send_manifest(self) -> None:
        self._manifest_sent = True
        if self.rank == 0:
            self._writer.submit_raw(layout.MANIFEST, dump_document(self.manifest()))

    def manifest(self) -> Manifest:
        """The job manifest this hook writes (rank 0, at the first step)."""
        cols = []
        for col in list(self.collections.values())[:256]:
            configs: dict[Any, ManifestSaveConfig] = {}
            if col.save_config is not None:
                for mode, conf in col.save_config.modes.items():
                    configs[mode.value] = ManifestSaveConfig(
                        save_interval=conf.interval,
                        start_step=conf.start_step or 0,
                        end_step=conf.end_step,
                        save_steps=list(conf.save_steps or ())[:1000],
                    )
            cols.append(
                ManifestCollection(
                    name=col.name,
                    include_regex=col.include_regex[:64],
                    save_config=configs,
                    reductions=col.reductions(),
                    save_full=col.save_full,
                )
            )
        return Manifest(
            job=self.job_name,
            created=time.time(),
            hook_version=__version__,
            frameworks=[FrameworkInfo(name=n, version=v) for n, v in self._frameworks.items()],
            python=platform.python_version(),
            host=socket.gethostname()[:256],
            world_size=self.world_size,
            collections=cols,
            rules=self.rules,
            sagemaker_training_job_name=env.sagemaker_training_job_name(),
            allow_sagemaker_stop=self.sagemaker_stop,
            system_interval_s=self._monitor.interval_s if self._monitor is not None else None,
            structure=(
                ModelStructure(tensors=dict(self._structure), omitted=self._structure_omitted)
                if self._structure or self._structure_omitted
                else None
            ),
        )

    # ------------------------------------------------------------------ stop signal
    def request_stop_check(self) -> bool:
        """Check for the stop signal now (synchronously); returns ``should_stop``."""
        return self._stop.check_now()

    # ------------------------------------------------------------------ flushing and closing
    @_guarded()
    def flush(self) -> None:
        """End the current step and write the open window now (e.g. before a checkpoint)."""
        if self._closed:
            return
        with self._lock:
            self._seal(self._book.step)
        self._writer.request_flush()

    def close(self) -> HookReport:
        """Seal the last step, write the last segment and this worker's end marker; report.

        Waits at most ``flush_timeout_s`` for delivery. What could not be delivered, and
        anything dropped, is reported loudly (a log error and a summary on stderr) and in the
        returned ``HookReport``.
        """
        if self._closed:
            assert self._report is not None or self.dry_run
            return self._report or self._empty_report()
        self._closed = True
        started = time.monotonic()
        self._stop.close()
        try:
            if self._torch is not None:
                self._torch.remove()
            if self._monitor is not None:
                with self._lock:
                    if self._timed_step is not None:
                        self._monitor.step_ended(self._timed_step[0].value, self._timed_step[1])
                self._monitor.close()  # flushes its last batch into the writer
            if not self.dry_run:
                with self._lock:
                    self._seal(self._book.step)
                    if not self._manifest_sent:
                        self._send_manifest()
                self._check_received()
        except Exception as exc:
            self._disable(exc, where="close")
        if self.dry_run:
            self._report = self._empty_report()
            return self._report
        try:
            self._writer.close(self.flush_timeout_s)
            left = max(0.0, self.flush_timeout_s - (time.monotonic() - started))
            delivery = self._delivery.close(left)
            marker_ok = self._write_end_marker(delivery)
        except Exception as exc:  # never let closing break the end of a job
            log.error("trainguard: closing the hook failed: %s", exc, exc_info=True)
            self._report = HookReport(
                self.job_name, self.rank, self._store.url, self._builder.seq, self._builder.steps_written,
                undelivered=self._delivery.backlog, undelivered_bytes=0, dropped=self._drops.totals(),
                error=f"closing failed: {exc}", end_marker_written=False,
            )  # fmt: skip
            announce(self._report)
            return self._report
        self._report = HookReport(
            job=self.job_name,
            worker=self.rank,
            url=self._store.url,
            segments=self._builder.seq,
            steps_written=self._builder.steps_written,
            undelivered=delivery.undelivered,
            undelivered_bytes=delivery.undelivered_bytes,
            dropped=self._drops.totals(),
            error=delivery.error,
            spill_dir=delivery.spill_dir,
            end_marker_written=marker_ok,
        )
        if not self._report.ok:
            announce(self._report)
        forget_current(self)
        return self._report

    def _empty_report(self) -> HookReport:
        return HookReport(self.job_name, self.rank, self._store.url, 0, 0, 0, 0)

    def _write_end_marker(self, delivery: DeliveryReport) -> bool:
        marker = EndMarker(
            job=self.job_name,
            worker=self.rank,
            world_size=self.world_size,
            last_step=self._builder.prev_step,
            wall_time=time.time(),
            stopped=self.should_stop,
            dropped_objects=delivery.undelivered,
            steps_written=self._builder.steps_written,
            # after a lost batch the count would promise a batch that never comes: say nothing then
            system_batches=self._system_batches
            if self._monitor is not None and not delivery.undelivered
            else None,
            segments=self._builder.seq,
            dropped=dict(list(self._drops.totals().items())[:32]),
        )
        data = dump_document(marker)
        attempts = 1 if self._delivery.stats.permanent_failure else 3
        for attempt in range(attempts):
            try:
                self._store.put(layout.end_key(self.rank), data)
                return True
            except Exception as exc:
                if attempt == attempts - 1:
                    log.error("trainguard: could not write the end marker to %s: %s", self._store.url, exc)
                else:
                    time.sleep(0.2 * (attempt + 1))
        return False

    def _cleanup(self) -> None:
        """smdebug's name for ``close`` (its tests and scripts call it)."""
        self.close()

    def __enter__(self) -> Hook:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ errors
    def _writer_error(self, exc: BaseException) -> None:
        self._disable(exc, where="the background writer")

    def _disable(self, exc: BaseException, where: str) -> None:
        if self._disabled:
            return
        self._disabled = True
        log.error(
            "trainguard: internal error in %s; the hook disables itself and training continues",
            where,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        try:
            if self._torch is not None:
                self._torch.remove()
        except Exception as inner:
            log.error("trainguard: could not remove the PyTorch hooks after that error: %s", inner)

    def warn_once(self, key: str, message: str, *args: Any) -> None:
        """Log a warning once per ``key`` (integrations use it for what they cannot capture)."""
        if key not in self._warned and len(self._warned) < 10_000:
            self._warned.add(key)
            log.warning("trainguard: " + message, *args)

    def _valid_name(self, name: Any) -> bool:
        if isinstance(name, str) and 0 < len(name) <= stepfile.MAX_NAME_CHARS - 24 and name != "__metadata__":
            return True
        self._drop(
            "invalid_name", f"name:{str(name)[:80]}", "skipping invalid tensor name %r", str(name)[:80]
        )
        return False


def _scalar_collection(name: str) -> str:
    return CollectionKeys.LOSSES if is_loss_name(name) else CollectionKeys.SCALARS


def _normalized_rules(rules: Any) -> list[dict[str, Any]] | None:
    """The rule entries of any SageMaker rules document (None: the service's defaults)."""
    if rules is None:
        return None
    from trainguard.rules.sagemaker import normalize_rules  # the rules load only when given

    return normalize_rules(rules).entries()


def _parse_rules(rules: list[dict[str, Any]] | None) -> list[Any]:
    """The configured rules, parsed as the service parses them (None: the default set)."""
    from trainguard.rules.config import parse_rule_configurations

    try:
        return parse_rule_configurations(rules)
    except Exception as exc:  # never let a rules problem stop training
        log.warning("trainguard: cannot parse the rule configurations here (%s); recording the defaults", exc)
        return []


def _close_at_exit(ref: weakref.ReferenceType[Hook]) -> None:
    """A hook the user forgot to close still flushes (bounded) and writes its end marker."""
    hook = ref()
    if hook is not None:
        hook.close()


__all__ = ["Hook", "HookReport", "StopTrainingRequested", "del_hook", "get_hook"]
