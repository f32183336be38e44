"""``trainguard.Hook``: saves what the rules need, one object per (step, worker), off the hot path.

Mirrors smdebug's PyTorch hook, so migrating is an import change::

    hook = trainguard.Hook("s3://bucket/jobs/my-job", include_collections=["losses", "gradients"])
    hook.register_module(model)          # steps advance on each forward of ``model``
    hook.register_loss(criterion)        # losses saved from the criterion's output
    hook.set_mode(trainguard.modes.EVAL)

and works without a framework: every save call takes ``step=``::

    with trainguard.Hook("runs/my-job") as hook:
        for step in range(n):
            hook.save_scalar("loss", loss, step=step, collections=["losses"])
            hook.save_tensor("w", w, step=step, collections=["weights"])

Steps. The hook keeps a global step (the object key; smdebug's "global step") and, per
mode, a mode step (how many steps that mode has seen), which save configs are checked
against. The counter advances on each forward of the registered top module (the first
forward is step 0), or on ``advance_step()``/``set_step(n)``; ``step=`` on a save call
sets it explicitly. A step's record is sealed and queued when a later step begins or at
``close()``; a save for a step older than the last sealed one is ignored with a warning
(objects are never overwritten).

Never breaking the job: an internal error is logged once, with its traceback, and the
hook disables itself (every later call is a no-op); a bad argument to a save call (name,
dtype) is logged once per name and that tensor skipped. The one exception the hook raises
into the training loop is ``StopTrainingRequested``, and only if ``raise_on_stop`` (the
default: a rule with the StopTraining action asked for it), once, at a safe point (the
top module's forward pre-hook, ``advance_step``/``set_step`` or a save call).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import numpy as np

from trainguard.format import layout, stepfile
from trainguard.format.documents import (
    EndMarker,
    FrameworkInfo,
    Manifest,
    ManifestCollection,
    ManifestSaveConfig,
    ModeRecord,
    ScalarRecord,
    StepHeader,
    StopSignal,
    TensorRecord,
    TensorStats,
    dump_document,
    encode_step,
    parse_document,
    tensor_key,
)
from trainguard.hook import env
from trainguard.hook.config import Collection, CollectionKeys, SaveConfig, build_collections
from trainguard.hook.stats import PendingStats, StatSpec, numpy_stats, torch_stats
from trainguard.hook.storage import Store, open_store
from trainguard.hook.uploader import Uploader, UploadStats
from trainguard.modes import ModeKeys
from trainguard.version import __version__

log = logging.getLogger("trainguard.hook")

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_STOP_CHECK_INTERVAL_S = 5.0
DEFAULT_FLUSH_TIMEOUT_S = 30.0


class StopTrainingRequested(Exception):
    """The service asked this job to stop (a rule with the StopTraining action fired).

    Raised once, at a step boundary, when the hook has ``raise_on_stop=True``. Catch it to
    checkpoint and exit cleanly; ``signal`` says which rule asked and why.
    """

    def __init__(self, signal: StopSignal | None) -> None:
        self.signal = signal
        why = f" by rule {signal.rule}: {signal.reason}" if signal is not None else ""
        super().__init__(f"trainguard: stop requested{why}")


def _guarded(default: Any = None) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run a hook entry point; an internal error disables the hook instead of raising."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def inner(*args: P.args, **kwargs: P.kwargs) -> R:
            self = args[0]
            assert isinstance(self, Hook)
            if self._disabled:
                return default  # type: ignore[no-any-return]
            try:
                return fn(*args, **kwargs)
            except StopTrainingRequested:
                raise
            except Exception as exc:
                self._disable(exc, where=fn.__name__)
                return default  # type: ignore[no-any-return]

        return inner

    return wrap


@dataclass
class _PendingTensor:
    collections: list[str]
    dtype: str
    shape: list[int]
    stats: PendingStats | TensorStats | None
    #: a host copy (torch CPU tensor or numpy array) when the full tensor is stored
    full: Any = None


@dataclass
class _ModeBuffer:
    mode_step: int
    scalars: dict[str, tuple[Any, list[str]]] = field(default_factory=dict)
    tensors: dict[str, _PendingTensor] = field(default_factory=dict)


@dataclass
class _StepRecord:
    step: int
    wall_time: float
    modes: dict[str, _ModeBuffer] = field(default_factory=dict)


class Hook:
    """Saves losses, metrics and tensor statistics for trainguard's rules.

    Parameters
    ----------
    out_dir
        The job folder: ``s3://bucket/prefix/<job>`` or a local directory (same layout).
    save_config
        Applies to every collection not given its own (smdebug's precedence). Default:
        scalars and losses every step, tensor statistics every 50 steps
        (see ``trainguard.hook.config``).
    include_collections
        Collections to save (``CollectionKeys``); default ``CollectionKeys.DEFAULT_INCLUDED``.
    include_regex
        Extra tensors to save, by name (parameters, gradients ``gradient/<param>``, module
        inputs/outputs ``<module>_input_0``/``<module>_output_0``), into ``default``.
    collections
        ``Collection`` objects that add to or replace the built-in definitions, e.g. full
        gradients every 10 steps:
        ``Collection("gradients", SaveConfig(save_interval=10), save_full=True)``.
    rules
        SageMaker ``DebugRuleConfigurations`` entries, written to the manifest; None: the
        service's default rules.
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
        How long ``close()`` waits for the uploader to deliver what is queued.
    profiler
        Profile the job: True samples the host every 0.5 s (a float: that interval, 0.1 to
        60 s) and records step timings; batches are written every ``profiler_flush_s``
        seconds (``system/worker-<rank>/<seq>.json``), for the profiler rules and the report.
        Wrap the data loader with ``hook.timed_loader(loader)`` to time data waits.
    sample_system
        With several ranks per host, pass False on all but one: the others still send their
        step timings.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        save_config: SaveConfig | None = None,
        include_collections: Iterable[str] | None = None,
        include_regex: Sequence[str] | None = None,
        *,
        collections: Iterable[Collection] | None = None,
        rules: list[dict[str, Any]] | None = None,
        job_name: str | None = None,
        sagemaker_stop: bool = False,
        raise_on_stop: bool = True,
        stop_check_interval_s: float = DEFAULT_STOP_CHECK_INTERVAL_S,
        flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S,
        queue_size: int = 256,
        spill_dir: str | os.PathLike[str] | None = None,
        store: Store | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        profiler: bool | float = False,
        sample_system: bool = True,
        profiler_flush_s: float = 10.0,
    ) -> None:
        self.out_dir = os.fspath(out_dir)
        name = job_name or self.out_dir.rstrip("/").rsplit("/", 1)[-1]
        self.job_name = layout.validate_job_name(name)
        if rules is not None and (
            not isinstance(rules, list) or not all(isinstance(r, Mapping) for r in rules)
        ):
            raise ValueError(
                "rules must be a list of DebugRuleConfigurations dicts (or None for the defaults)"
            )
        self.rules = [dict(r) for r in rules] if rules is not None else None
        detected_rank, detected_world = env.rank_and_world()
        self.rank = detected_rank if rank is None else rank
        self.world_size = detected_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")
        self.collections: dict[str, Collection] = build_collections(
            include_collections, include_regex, save_config, collections
        )
        self.include_regex = list(include_regex or ())
        weights = self.collections.get(CollectionKeys.WEIGHTS)
        if weights is not None and any(_rule_to_invoke(r) == "WeightUpdateRatio" for r in self.rules or ()):
            weights.update_norm = True  # the rule needs ||W_s - W_prev||: keep a copy between saves
        self.sagemaker_stop = sagemaker_stop
        self.raise_on_stop = raise_on_stop
        self.flush_timeout_s = flush_timeout_s
        self._store = store or open_store(self.out_dir)
        spill = Path(spill_dir) if spill_dir else Path(tempfile.gettempdir()) / "trainguard-spill"
        self.spill_dir = spill / f"{self.job_name}-worker{self.rank:05d}-{os.getpid()}"
        self._uploader = Uploader(
            self._store,
            self._encode,
            queue_size=queue_size,
            spill_dir=self.spill_dir,
            on_error=self._writer_error,
        )
        self._lock = threading.RLock()
        self._mode = ModeKeys.TRAIN
        self._step = 0
        self._record: _StepRecord | None = None
        self._sealed_step: int | None = None  # newest step handed to the writer
        self._entered: tuple[int, ModeKeys] | None = None
        self._mode_step: dict[ModeKeys, int] = {}
        self._mode_global: dict[ModeKeys, int] = {}
        self._due: frozenset[str] = frozenset()
        self._due_cache: dict[tuple[ModeKeys, int], frozenset[str]] = {}
        self._warned: set[str] = set()
        self._disabled = False
        self._closed = False
        self._manifest_sent = False
        self._frameworks: dict[str, str | None] = {}
        self._torch: Any = None  # the TorchIntegration, once a module is registered
        #: tensor name -> position: parameters and their gradients are written in the
        #: model's parameter order (rules such as GradientNormRatio rely on it)
        self._order: dict[str, int] = {}
        #: previous saved copy per tensor, for ``update_l2`` (collections with update_norm)
        self._previous: dict[str, Any] = {}
        # written by the writer thread only
        self._last_written: int | None = None
        self._steps_written = 0
        # stop signal
        self._stop_event = threading.Event()
        self._stop_signal: StopSignal | None = None
        self._stop_raised = False
        self._closing = threading.Event()
        self._poller: threading.Thread | None = None
        if stop_check_interval_s and stop_check_interval_s > 0:
            self._poller = threading.Thread(
                target=self._poll_stop,
                args=(float(stop_check_interval_s),),
                name="trainguard-stop",
                daemon=True,
            )
            self._poller.start()
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
        atexit.register(_close_at_exit, weakref.ref(self))

    # ------------------------------------------------------------------ public state
    @property
    def disabled(self) -> bool:
        """True once an internal error switched the hook off."""
        return self._disabled

    @property
    def should_stop(self) -> bool:
        """True once the service wrote this job's stop signal (checked in the background)."""
        return self._stop_event.is_set()

    @property
    def stop_signal(self) -> StopSignal | None:
        return self._stop_signal

    @property
    def step(self) -> int:
        """The current global step."""
        return self._step

    @property
    def mode(self) -> ModeKeys:
        return self._mode

    @property
    def upload_stats(self) -> UploadStats:
        return self._uploader.stats

    @property
    def store(self) -> Store:
        return self._store

    def get_collection(self, name: str) -> Collection:
        """A collection's definition (created with defaults if new); edit it before the first step."""
        col = self.collections.get(name)
        if col is None:
            col = build_collections([name], None, None, None)[name]
            self.collections[name] = col
            self._due_cache.clear()
        return col

    # ------------------------------------------------------------------ steps and modes
    @_guarded()
    def set_mode(self, mode: ModeKeys | str) -> None:
        """Switch mode (TRAIN, EVAL, PREDICT, GLOBAL). The global step is not advanced."""
        try:
            new = mode if isinstance(mode, ModeKeys) else ModeKeys(str(getattr(mode, "value", mode)).upper())
        except ValueError:
            self._warn_once(f"mode:{mode}", "ignoring set_mode(%r): not a trainguard mode", mode)
            return
        with self._lock:
            self._mode = new
            self._entered = None

    @_guarded()
    def advance_step(self) -> None:
        """End the current step: its record is queued and the counter moves to the next step."""
        self._check_stop()
        with self._lock:
            self._seal()
            self._step += 1
            self._entered = None
            self._time_step()

    # ------------------------------------------------------------------ profiling
    def timed_loader(self, iterable: Any) -> Any:
        """Wrap a DataLoader (any iterable): time spent waiting for the next batch is recorded.

        Without ``profiler=`` it returns ``iterable`` unchanged.
        """
        return self._monitor.timed_loader(iterable) if self._monitor is not None else iterable

    def _emit_system(self, key: str, data: bytes) -> None:
        """The monitor's batches go through the same uploader as the steps (spill, retry)."""
        self._system_batches += 1
        self._uploader.submit_encoded(key, data)

    def _time_step(self) -> None:
        """A step boundary for the profiler's step timings (caller holds the lock)."""
        monitor = self._monitor
        if monitor is None:
            return
        current = (self._mode, self._step)
        if self._timed_step == current:
            return
        if self._timed_step is None:
            monitor.mark_initialized()
        else:
            monitor.step_ended(self._timed_step[0].value, self._timed_step[1])
        monitor.step_started(self._mode.value, self._step)
        self._timed_step = current

    @_guarded()
    def set_step(self, step: int) -> None:
        """Make ``step`` the current global step (seals the current one if different)."""
        self._check_stop()
        try:
            step = _check_step(step)
        except ValueError as exc:
            self._warn_once(f"arg:{exc}", "ignoring set_step: %s", exc)
            return
        with self._lock:
            if step != self._step:
                self._seal()
            self._step = step
            self._entered = None
            self._time_step()

    # ------------------------------------------------------------------ saving
    @_guarded(default=False)
    def save_scalar(
        self,
        name: str,
        value: Any,
        step: int | None = None,
        collections: Sequence[str] | None = None,
        *,
        mode: ModeKeys | str | None = None,
    ) -> bool:
        """Save a scalar (loss, metric...) if one of its collections is due. Returns whether saved.

        Default collection: ``scalars``; use ``collections=["losses"]`` for a loss, which is
        what the loss rules read.
        """
        self._check_stop()
        cols = list(collections) if collections else [CollectionKeys.SCALARS]
        if not self._valid_name(name):
            return False
        with self._lock:
            due = self._enter_checked(step, mode)
            if due is None or not due.intersection(cols):
                return False
            try:
                scalar = _scalar(value)
            except (TypeError, ValueError) as exc:
                self._warn_once(f"scalar:{name}", "skipping scalar %r: %s", name, exc)
                return False
            for c in cols:
                self.get_collection(c)
            self._mode_buffer().scalars[name] = (scalar, cols)
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
    ) -> bool:
        """Save a tensor's statistics (and the full tensor if a collection has ``save_full``).

        ``value``: a numpy array, a torch tensor (reduced on its device) or anything
        ``np.asarray`` accepts (JAX arrays). Saved only if one of ``collections`` (default
        ``default``) is due at this step. Returns whether it was saved.
        """
        self._check_stop()
        if isinstance(collections, str):
            collections = [collections]
        cols = list(collections) if collections else [CollectionKeys.DEFAULT]
        if not self._valid_name(name):
            return False
        with self._lock:
            due = self._enter_checked(step, mode)
            if due is None or not due.intersection(cols):
                return False
            return self._save_tensor_now(name, value, [self.get_collection(c) for c in cols])

    def _save_tensor_now(self, name: str, value: Any, cols: list[Collection]) -> bool:
        """Reduce (and copy, if asked) one tensor into the current step's record. Caller holds the lock."""
        is_torch = type(value).__module__.startswith("torch") and hasattr(value, "detach")
        spec = StatSpec.of(cols)
        full = any(c.save_full for c in cols)
        try:
            if is_torch:
                stats: PendingStats | TensorStats = torch_stats(value, spec)
                dtype = str(value.dtype).removeprefix("torch.")
                shape = [int(d) for d in value.shape]
                copy = value.detach().to("cpu", copy=True) if full else None
                if copy is not None and dtype not in _TORCH_STORABLE:
                    self._warn_once(
                        f"dtype:{name}",
                        "cannot store tensor %r of dtype %s in full; statistics only",
                        name,
                        dtype,
                    )
                    copy = None
            else:
                array = np.asarray(value)
                stats = numpy_stats(array, spec)
                dtype, shape = array.dtype.name, [int(d) for d in array.shape]
                copy = np.array(array, copy=True) if full else None
                if copy is not None and not _numpy_storable(copy.dtype):
                    self._warn_once(
                        f"dtype:{name}",
                        "cannot store tensor %r of dtype %s in full; statistics only",
                        name,
                        dtype,
                    )
                    copy = None
        except TypeError as exc:
            self._warn_once(f"type:{name}", "skipping tensor %r: %s", name, exc)
            return False
        if any(c.update_norm for c in cols):
            stats = self._with_update_norm(name, value, stats, is_torch)
        if len(shape) > stepfile.MAX_NDIM:
            self._warn_once(
                f"ndim:{name}", "skipping tensor %r: more than %d dimensions", name, stepfile.MAX_NDIM
            )
            return False
        self._mode_buffer().tensors[name] = _PendingTensor([c.name for c in cols], dtype, shape, stats, copy)
        return True

    def _with_update_norm(
        self, name: str, value: Any, stats: PendingStats | TensorStats, is_torch: bool
    ) -> PendingStats | TensorStats:
        """Attach ``update_l2`` = ||value - previous save of ``name``|| (None on the first save)."""
        prev = self._previous.get(name)
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
                self._previous[name] = cur.clone()
        else:
            cur_np = np.asarray(value)
            if prev is not None and getattr(prev, "shape", None) == cur_np.shape:
                update = float(np.linalg.norm((cur_np.astype(np.float64) - prev).ravel()))
            self._previous[name] = cur_np.astype(np.float64, copy=True)
        if update is None:
            return stats
        if isinstance(stats, PendingStats):
            stats.update_l2 = update
            return stats
        return stats.model_copy(update={"update_l2": float(update)})

    # ------------------------------------------------------------------ framework integration
    @_guarded()
    def register_module(self, module: Any) -> None:
        """Hook a PyTorch module: steps advance on each of its forwards; weights, gradients and
        activations are saved per the collections (see ``trainguard.hook.torch_support``)."""
        from trainguard.hook.torch_support import TorchIntegration

        if self._torch is None:
            self._torch = TorchIntegration(self)
        self._torch.register_module(module)

    @_guarded()
    def register_loss(self, loss_module: Any) -> None:
        """Save a loss module's output (``losses``) and, when included, its inputs
        (``predictions``, ``labels``) on each call."""
        from trainguard.hook.torch_support import TorchIntegration

        if self._torch is None:
            self._torch = TorchIntegration(self)
        self._torch.register_loss(loss_module)

    def _framework(self, name: str, version: str | None) -> None:
        self._frameworks[name] = version

    # ------------------------------------------------------------------ due-ness and records
    def _enter_checked(self, step: Any, mode: Any) -> frozenset[str] | None:
        """``_enter`` for user-supplied arguments: a bad step or mode is logged and skipped."""
        try:
            if step is not None:
                step = _check_step(step)
            if mode is not None and not isinstance(mode, ModeKeys):
                mode = ModeKeys(str(mode).upper())
        except ValueError as exc:
            self._warn_once(f"arg:{exc}", "ignoring a save call: %s", exc)
            return None
        return self._enter(step, mode)

    def _enter(self, step: int | None, mode: ModeKeys | str | None) -> frozenset[str] | None:
        """Make (step, mode) current and return the collections due there (None: too old)."""
        m = (
            self._mode
            if mode is None
            else (mode if isinstance(mode, ModeKeys) else ModeKeys(str(mode).upper()))
        )
        explicit = step is not None
        if step is not None:
            step = _check_step(step)
            if step != self._step:
                self._seal()
                self._step = step
                self._entered = None
        if self._monitor is not None:
            self._time_step()
        if self._entered == (self._step, m):
            return self._due
        if self._sealed_step is not None and self._step <= self._sealed_step:
            self._warn_once(
                f"old:{self._step}",
                "ignoring saves for step %d: step %d was already written (steps must increase)",
                self._step,
                self._sealed_step,
            )
            return None
        if not self._manifest_sent:
            self._send_manifest()
        if self._mode_global.get(m) != self._step:
            self._mode_global[m] = self._step
            # An explicit ``step=`` (a plain loop's own counter) is the mode's step too, so rules
            # and save intervals count the user's steps; framework integrations count steps
            # per mode, as smdebug does.
            self._mode_step[m] = self._step if explicit else self._mode_step.get(m, -1) + 1
        mode_step = self._mode_step[m]
        key = (m, mode_step)
        due = self._due_cache.get(key)
        if due is None:
            if len(self._due_cache) > 64:
                self._due_cache.clear()
            due = frozenset(
                name
                for name, col in self.collections.items()
                if col.save_config is not None and col.save_config.should_save_step(m, mode_step)
            )
            self._due_cache[key] = due
        self._entered = (self._step, m)
        self._due = due
        return due

    def _mode_buffer(self) -> _ModeBuffer:
        assert self._entered is not None
        step, mode = self._entered
        if self._record is None:
            self._record = _StepRecord(step, time.time())
        buf = self._record.modes.get(mode.value)
        if buf is None:
            buf = self._record.modes[mode.value] = _ModeBuffer(self._mode_step[mode])
        return buf

    def _seal(self) -> None:
        """Queue the current step's record (if anything was saved). Caller holds the lock."""
        record, self._record = self._record, None
        if record is None:
            return
        self._sealed_step = record.step
        self._uploader.submit(record)

    def _send_manifest(self) -> None:
        self._manifest_sent = True
        if self.rank == 0:
            self._uploader.submit_encoded(layout.MANIFEST, dump_document(self.manifest()))

    def manifest(self) -> Manifest:
        """The job manifest this hook writes (rank 0, at the first step)."""
        cols = []
        for col in self.collections.values():
            configs: dict[Any, ManifestSaveConfig] = {}
            if col.save_config is not None:
                for mode, conf in col.save_config.modes.items():
                    configs[mode.value] = ManifestSaveConfig(
                        save_interval=conf.interval,
                        start_step=conf.start_step or 0,
                        end_step=conf.end_step,
                        save_steps=list(conf.save_steps or ()),
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
        )

    # ------------------------------------------------------------------ writer thread
    def _encode(self, record: _StepRecord) -> tuple[str, bytes]:
        """Turn a sealed record into (key, bytes). Runs in the writer thread, in step order."""
        body: dict[str, stepfile.TensorBlob] = {}
        modes: dict[Any, ModeRecord] = {}
        for mode, buf in record.modes.items():
            scalars = {
                n: ScalarRecord.model_construct(value=_to_float(v), collections=c)
                for n, (v, c) in buf.scalars.items()
            }
            tensors: dict[str, TensorRecord] = {}
            order = self._order
            items = (
                sorted(buf.tensors.items(), key=lambda kv: order.get(kv[0], 1 << 30))
                if order
                else buf.tensors.items()
            )
            for name, pending in items:
                stats = pending.stats.finalize() if isinstance(pending.stats, PendingStats) else pending.stats
                stored = False
                if pending.full is not None:
                    body[tensor_key(mode, name)] = _blob(pending.full)
                    stored = True
                tensors[name] = TensorRecord.model_construct(
                    collections=pending.collections[:32],
                    dtype=pending.dtype,
                    shape=pending.shape,
                    stats=stats,
                    stored=stored,
                )
            modes[mode] = ModeRecord.model_construct(
                mode_step=buf.mode_step, scalars=scalars, tensors=tensors
            )
        header = StepHeader(
            job=self.job_name,
            step=record.step,
            worker=self.rank,
            world_size=self.world_size,
            prev_step=self._last_written,
            wall_time=record.wall_time,
            modes=modes,
        )
        data = encode_step(header, body)
        self._last_written = record.step
        self._steps_written += 1
        return layout.step_key(record.step, self.rank), data

    def _writer_error(self, exc: BaseException) -> None:
        self._disable(exc, where="the background writer")

    # ------------------------------------------------------------------ stop signal
    def _poll_stop(self, interval: float) -> None:
        failures = 0
        while not self._closing.wait(interval):
            try:
                if not self._store.exists(layout.STOP_SIGNAL):
                    failures = 0
                    continue
                raw = self._store.get(layout.STOP_SIGNAL)
            except Exception as exc:
                failures += 1
                if failures == 1:
                    log.warning("trainguard: cannot check for the stop signal (%s); will keep trying", exc)
                continue
            try:
                self._stop_signal = parse_document(StopSignal, raw)
            except ValueError as exc:
                log.warning("trainguard: the stop signal is malformed (%s); stopping anyway", str(exc)[:200])
            log.warning(
                "trainguard: the service asked job %s to stop%s",
                self.job_name,
                f" (rule {self._stop_signal.rule}: {self._stop_signal.reason})" if self._stop_signal else "",
            )
            self._stop_event.set()
            return

    def _check_stop(self) -> None:
        if self._stop_event.is_set() and self.raise_on_stop and not self._stop_raised:
            self._stop_raised = True
            raise StopTrainingRequested(self._stop_signal)

    def request_stop_check(self) -> bool:
        """Check for the stop signal now (synchronously); returns ``should_stop``."""
        if not self._stop_event.is_set() and self._store.exists(layout.STOP_SIGNAL):
            try:
                self._stop_signal = parse_document(StopSignal, self._store.get(layout.STOP_SIGNAL))
            except ValueError:
                self._stop_signal = None
            self._stop_event.set()
        return self.should_stop

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Seal the last step, flush within ``flush_timeout_s`` and write this worker's end marker."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        try:
            if self._torch is not None:
                self._torch.remove()
            if self._monitor is not None:
                with self._lock:
                    if self._timed_step is not None:
                        self._monitor.step_ended(self._timed_step[0].value, self._timed_step[1])
                self._monitor.close()  # flushes its last batch into the uploader
            if not self._disabled:
                with self._lock:
                    self._seal()
                    if not self._manifest_sent:
                        self._send_manifest()
        except Exception as exc:
            self._disable(exc, where="close")
        self._uploader.close(self.flush_timeout_s)
        self._write_end_marker()

    def _write_end_marker(self) -> None:
        stats = self._uploader.stats
        marker = EndMarker(
            job=self.job_name,
            worker=self.rank,
            world_size=self.world_size,
            last_step=self._last_written,
            wall_time=time.time(),
            stopped=self.should_stop,
            dropped_objects=stats.dropped,
            steps_written=self._steps_written,
            # after a drop the count would promise a batch that never comes: say nothing then
            system_batches=self._system_batches if self._monitor is not None and not stats.dropped else None,
        )
        data = dump_document(marker)
        for attempt in range(3):
            try:
                self._store.put(layout.end_key(self.rank), data)
                break
            except Exception as exc:
                if attempt == 2:
                    log.error("trainguard: could not write the end marker to %s: %s", self._store.url, exc)
                else:
                    time.sleep(0.2 * (attempt + 1))
        if stats.dropped:
            log.error(
                "trainguard: job %s worker %d: %d objects were dropped (%d written)",
                self.job_name,
                self.rank,
                stats.dropped,
                stats.written,
            )

    def __enter__(self) -> Hook:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ errors
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
        except Exception:  # noqa: S110 - already disabled; nothing more to do
            pass

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned and len(self._warned) < 10_000:
            self._warned.add(key)
            log.warning("trainguard: " + message, *args)

    def _valid_name(self, name: Any) -> bool:
        if isinstance(name, str) and 0 < len(name) <= stepfile.MAX_NAME_CHARS - 8 and name != "__metadata__":
            return True
        self._warn_once(f"name:{str(name)[:80]}", "skipping invalid tensor name %r", str(name)[:80])
        return False


_TORCH_STORABLE = frozenset(
    {
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "uint16",
        "uint32",
        "uint64",
    }
)


def _numpy_storable(dtype: np.dtype[Any]) -> bool:
    if dtype.name == "bfloat16":
        return True
    try:
        stepfile.TensorBlob.from_numpy(np.zeros(0, dtype=dtype))
    except stepfile.StepFormatError:
        return False
    return True


def _blob(value: Any) -> stepfile.TensorBlob:
    """A full tensor (host copy) as a TensorBlob over its buffer (no extra copy); bfloat16 as raw bits."""
    if type(value).__module__.startswith("torch"):
        import torch

        if value.dtype == torch.bfloat16:
            return _view_blob("BF16", value.contiguous().view(torch.int16).numpy().view(np.uint16))
        array = value.contiguous().numpy()
    else:
        array = np.asarray(value)
        if array.dtype.name == "bfloat16":
            return _view_blob("BF16", array.view(np.uint16))
    blob = stepfile.TensorBlob.from_numpy(np.zeros(0, dtype=array.dtype))  # validates the dtype, names it
    return _view_blob(blob.dtype, array.astype(array.dtype.newbyteorder("<"), copy=False))


def _view_blob(name: str, array: np.ndarray[Any, Any]) -> stepfile.TensorBlob:
    """Wrap a little-endian array's buffer (copied only if it is not contiguous)."""
    shape = tuple(int(d) for d in array.shape)
    flat = np.ascontiguousarray(array).reshape(-1)  # (ascontiguousarray makes 0-d arrays 1-d)
    data = memoryview(flat).cast("B") if flat.size else b""  # type: ignore[arg-type]
    return stepfile.TensorBlob(name, shape, data)


def _scalar(value: Any) -> Any:
    """Keep device tensors as they are (converted in the writer: no sync on the hot path)."""
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        t = value.detach()
        if t.numel() != 1:
            raise TypeError(f"a scalar must have one element, got shape {tuple(t.shape)}")
        return t if t.device.type != "cpu" else float(t)
    return _to_float(value)


def _to_float(value: Any) -> float:
    if hasattr(value, "item"):
        value = value.item()
    result = float(value)
    return result if not isinstance(result, bool) else float(result)


def _close_at_exit(ref: weakref.ReferenceType[Hook]) -> None:
    """A hook the user forgot to close still flushes (bounded) and writes its end marker."""
    hook = ref()
    if hook is not None:
        hook.close()


def _rule_to_invoke(entry: Any) -> Any:
    params = entry.get("RuleParameters") if isinstance(entry, Mapping) else None
    return params.get("rule_to_invoke") if isinstance(params, Mapping) else None


def _check_step(step: Any) -> int:
    if (
        isinstance(step, bool)
        or not isinstance(step, int | np.integer)
        or not 0 <= int(step) <= layout.MAX_STEP
    ):
        raise ValueError(f"step must be an integer in 0..{layout.MAX_STEP}, got {step!r}")
    return int(step)


__all__ = ["Hook", "StopTrainingRequested"]
