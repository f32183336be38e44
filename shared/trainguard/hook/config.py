"""What the hook saves and when: save configurations and collections, smdebug-compatible.

``SaveConfig`` / ``SaveConfigMode`` keep smdebug's names and semantics, so a migrating
user changes an import, not a config::

    SaveConfig(save_interval=10)                                   # every mode
    SaveConfig(mode_save_configs={modes.TRAIN: SaveConfigMode(save_interval=1),
                                  modes.EVAL: SaveConfigMode(save_interval=10)})

A step is due for a collection when its *mode step* (steps counted inside one mode, as
smdebug counts them) is in ``save_steps``, or is inside ``[start_step, end_step)`` and a
multiple of ``save_interval``.

Defaults, and why (measured by ``bench/hook_overhead.py``; figures in docs/benchmarks.md):

* ``losses``, ``metrics``, ``scalars``: every step. A scalar costs a few microseconds and
  a few bytes; LossNotDecreasing, Overfit and Overtraining compare losses across steps, and
  smdebug's every-500-steps default was the top complaint: rules saw almost nothing.
* ``weights``, ``biases``, ``gradients``, ``relu_output``: statistics (no full tensor)
  every ``DEFAULT_TENSOR_INTERVAL`` (50) steps. Reducing every parameter, gradient and
  ReLU output is a few memory passes over the model per step: on the benchmark's CPU
  models it costs ~30-60% of the step's CPU time when done every step (a weight-heavy MLP
  with a small batch is the worst case; on a GPU it is a few fused kernels), so every 10
  steps would still cost 3-6%, and every 50 costs ~1%, within the default's budget.
  VanishingGradient, ExplodingTensor and DeadRelu still get a sample every 50 steps, ten
  times finer than smdebug's 500; ExplodingTensor also sees the losses of every step.
* Everything else (activation inputs, model inputs/outputs, labels, predictions) is off
  until included or until a configured rule reads them (SaturatedActivation turns on
  ``tanh_input``/``sigmoid_input``, ClassImbalance ``labels``/``predictions``...): they cost
  memory bandwidth per forward and only some rules need them.

Which statistics a tensor gets is decided by the configured rules (``Rule.reads()``; see
``trainguard.hook.selection``), plus ``Collection.statistics`` when the user names some, plus
the standard set (``STANDARD_STATISTICS``) for a collection the user included explicitly.
``Hook(statistics="all")`` asks for everything.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.modes import ModeKeys

#: Every save interval of a tensor collection unless configured (see the module docstring).
DEFAULT_TENSOR_INTERVAL = 50
#: Scalars and losses: every step.
DEFAULT_SCALAR_INTERVAL = 1
#: Percentiles computed for gradients (PoorWeightInitialization reads the 95th-5th spread).
GRADIENT_PERCENTILES = (5.0, 50.0, 95.0)
#: Bands of SaturatedActivation's defaults: a unit is saturated when its input is outside.
TANH_BAND = (-9.4999, 9.4999)
SIGMOID_BAND = (-23.0, 16.99999)
TRAINING_MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT, ModeKeys.GLOBAL)
#: The statistics every tensor of a collection the user included explicitly gets (and every
#: explicit ``save_tensor``), on top of what the configured rules read: the cheap core of
#: ``TensorStats`` (a few vectorised passes). Percentiles, histograms and per-unit fractions
#: cost more and come only from the collection's settings or a rule that reads them.
STANDARD_STATISTICS = ("numel", "mean", "std", "min", "max", "mean_abs", "l1", "l2", "zeros", "nan", "inf")
#: smdebug's ``losses`` collection regex for PyTorch (``CollectionManager``): module outputs
#: such as ``CrossEntropyLoss_output_0``.
SMDEBUG_LOSS_REGEX = r"[Ll]oss_(?!input).*output"
_LOSS_NAME = re.compile(SMDEBUG_LOSS_REGEX + r"|Loss|(?:^|[^A-Za-z0-9])loss(?:$|[^A-Za-z])|^loss", re.ASCII)


def is_loss_name(name: str) -> bool:
    """Whether a scalar saved without collections counts as a loss (and goes to ``losses``).

    smdebug's losses regex (``CrossEntropyLoss_output_0``), any name containing ``Loss``, and
    ``loss`` as a word of the name: ``loss``, ``val_loss``, ``my_loss``, ``loss/train``. A loss
    *scale* (mixed precision's ``loss_scale``) is not a loss.
    """
    return bool(_LOSS_NAME.search(name)) and "scale" not in name.lower()


class CollectionKeys:
    """Built-in collection names (smdebug's, where smdebug has one)."""

    LOSSES = "losses"
    METRICS = "metrics"
    SCALARS = "scalars"
    WEIGHTS = "weights"
    BIASES = "biases"
    GRADIENTS = "gradients"
    RELU_OUTPUT = "relu_output"
    RELU_INPUT = "relu_input"
    TANH_INPUT = "tanh_input"
    SIGMOID_INPUT = "sigmoid_input"
    INPUTS = "inputs"
    OUTPUTS = "outputs"
    LABELS = "labels"
    PREDICTIONS = "predictions"
    #: tensors selected by the hook's ``include_regex``
    DEFAULT = "default"
    #: smdebug's ``save_all``: every parameter, gradient and module input/output
    ALL = "all"

    BUILT_IN = (
        LOSSES,
        METRICS,
        SCALARS,
        WEIGHTS,
        BIASES,
        GRADIENTS,
        RELU_OUTPUT,
        RELU_INPUT,
        TANH_INPUT,
        SIGMOID_INPUT,
        INPUTS,
        OUTPUTS,
        LABELS,
        PREDICTIONS,
        DEFAULT,
        ALL,
    )
    SCALAR_COLLECTIONS = (LOSSES, METRICS, SCALARS)
    #: what every hook saved by default before the configured rules chose, and what a rule
    #: that does not declare its reads is given (``trainguard.hook.selection``)
    DEFAULT_INCLUDED = (LOSSES, METRICS, SCALARS, WEIGHTS, BIASES, GRADIENTS, RELU_OUTPUT)


@dataclass(frozen=True)
class SaveConfigMode:
    """When to save in one mode (smdebug's ``SaveConfigMode``)."""

    save_interval: int | None = None
    start_step: int | None = None
    end_step: int | None = None
    save_steps: Sequence[int] | None = None

    def __post_init__(self) -> None:
        if self.save_interval is not None and (
            not isinstance(self.save_interval, int) or self.save_interval < 1
        ):
            raise ValueError(f"save_interval must be a positive integer, got {self.save_interval!r}")
        for label, value in (("start_step", self.start_step), ("end_step", self.end_step)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{label} must be a non-negative integer or None, got {value!r}")
        if self.save_steps is not None:
            steps = tuple(self.save_steps)
            if not all(isinstance(s, int) and s >= 0 for s in steps):
                raise ValueError("save_steps must be non-negative integers")
            object.__setattr__(self, "save_steps", tuple(sorted(set(steps))))

    @property
    def interval(self) -> int:
        return self.save_interval or 1

    def should_save(self, mode_step: int) -> bool:
        if self.save_steps and mode_step in self.save_steps:
            return True
        if self.save_steps and self.save_interval is None:
            return False  # only the listed steps
        start = self.start_step or 0
        if mode_step < start or (self.end_step is not None and mode_step >= self.end_step):
            return False
        return mode_step % self.interval == 0


class SaveConfig:
    """When to save, per mode (smdebug's ``SaveConfig``).

    Either one set of values for every mode (``save_interval=...``), or
    ``mode_save_configs={mode: SaveConfigMode(...)}`` (modes not listed use the plain values).
    """

    def __init__(
        self,
        mode_save_configs: Mapping[ModeKeys | str, SaveConfigMode | Mapping[str, Any]] | None = None,
        save_interval: int | None = None,
        start_step: int | None = None,
        end_step: int | None = None,
        save_steps: Sequence[int] | None = None,
    ) -> None:
        if mode_save_configs is not None and not isinstance(mode_save_configs, Mapping):
            raise TypeError(
                "SaveConfig's first argument is mode_save_configs (a {mode: SaveConfigMode} dict); "
                f"got {mode_save_configs!r}: did you mean SaveConfig(save_interval={mode_save_configs!r})?"
            )
        base = SaveConfigMode(save_interval, start_step, end_step, save_steps)
        self.modes: dict[ModeKeys, SaveConfigMode] = {m: base for m in TRAINING_MODES}
        for mode, conf in (mode_save_configs or {}).items():
            key = ModeKeys(mode.value if isinstance(mode, ModeKeys) else str(mode).upper())
            self.modes[key] = conf if isinstance(conf, SaveConfigMode) else SaveConfigMode(**dict(conf))

    @classmethod
    def every(cls, interval: int) -> SaveConfig:
        return cls(save_interval=interval)

    def get_save_config(self, mode: ModeKeys) -> SaveConfigMode:
        return self.modes[mode]

    def should_save_step(self, mode: ModeKeys, mode_step: int) -> bool:
        return self.modes[mode].should_save(mode_step)

    def __repr__(self) -> str:
        return f"SaveConfig({ {m.value: c for m, c in self.modes.items()} })"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SaveConfig) and self.modes == other.modes

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class ReductionConfig:
    """smdebug's ``ReductionConfig``: which reductions a collection saves.

    Read as the ``TensorStats`` fields it corresponds to (``Collection.statistics``): ``min``,
    ``max``, ``mean``, ``std``/``variance``, ``l1``/``l2`` norms, their ``abs_`` forms
    (``abs_mean`` is ``mean_abs``). ``save_raw_tensor=True`` also stores the full tensor.
    Reductions trainguard has no statistic for (``prod``, ``sum``) are accepted and ignored.
    """

    reductions: Sequence[str] = ()
    abs_reductions: Sequence[str] = ()
    norms: Sequence[str] = ()
    abs_norms: Sequence[str] = ()
    save_raw_tensor: bool = False
    save_shape: bool = False

    def statistics(self) -> tuple[str, ...]:
        from trainguard.hook.sagemaker import reduction_statistics

        return reduction_statistics(self)


@dataclass
class Collection:
    """A named group of tensors with its own save schedule and statistics.

    ``save_full`` stores the full tensor (in the step object's body) on due steps, besides
    the statistics. ``percentiles``, ``histogram_bins`` and the per-unit reductions are
    computed only for collections that ask, because each costs a pass over the tensor.
    """

    name: str
    save_config: SaveConfig | None = None
    include_regex: list[str] = field(default_factory=list)
    save_full: bool = False
    percentiles: tuple[float, ...] = ()
    histogram_bins: int = 0
    #: histogram range; None: the tensor's own min..max
    histogram_range: tuple[float, float] | None = None
    #: per-unit fraction of samples > 0 (DeadRelu)
    unit_active: bool = False
    #: per-unit fraction of samples inside this band (SaturatedActivation)
    unit_band: tuple[float, float] | None = None
    #: which axis holds the units for a tensor of 3 dimensions: -1 (sequence models:
    #: (N, T, D)) or 1 (1-d convolutions: (N, C, L)). 2-d tensors use the last axis, 4+-d
    #: tensors (N, C, ...) the channel axis.
    unit_axis_3d: int = -1
    #: small tensors (at most ``MAX_VALUES`` elements): send every element in the statistics
    #: (labels, predictions: ClassImbalance and Confusion count classes)
    values: bool = False
    #: integer tensors (token ids): counts of the most frequent values (NLPSequenceRatio);
    #: small integer tensors send ``values`` instead
    value_counts: bool = False
    #: ``update_l2``: the L2 norm of the change since the previous save (WeightUpdateRatio).
    #: Keeps a copy of each tensor between saves, so it is on only when that rule is declared.
    update_norm: bool = False
    #: ``TensorStats`` fields to compute for this collection's tensors besides what the
    #: configured rules read (None: the standard set if the user included the collection
    #: explicitly, else only what the rules read; ``("all",)``: every field)
    statistics: tuple[str, ...] | None = None
    #: smdebug's ``Collection.tensor_names``: exact names that belong to the collection
    tensor_names: set[str] = field(default_factory=set)
    #: modules whose inputs/outputs belong to the collection (``add_module_tensors``): object
    #: id -> (module, inputs, outputs); resolved to ``<module name>_input_<i>`` /
    #: ``_output_<i>`` names when the model is registered
    modules: dict[int, tuple[Any, bool, bool]] = field(default_factory=dict, repr=False, compare=False)
    #: smdebug's ``reduction_config`` (its statistics unless ``statistics`` is given; with
    #: ``save_raw_tensor`` the full tensor too) and ``save_histogram`` (TensorBoard only: ignored)
    reduction_config: ReductionConfig | None = None
    save_histogram: bool = True

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError("a collection needs a non-empty name")
        if not 0 <= self.histogram_bins <= 256:
            raise ValueError("histogram_bins must be in 0..256")
        if len(self.percentiles) > 16 or not all(0.0 <= p <= 100.0 for p in self.percentiles):
            raise ValueError("at most 16 percentiles, each in 0..100")
        if isinstance(self.include_regex, str):
            self.include_regex = [self.include_regex]
        for regex in self.include_regex:
            _check_regex(regex)
        if self.statistics is not None:
            self.statistics = _check_statistics(self.statistics)
        self.tensor_names = set(self.tensor_names or ())
        if self.reduction_config is not None:
            self.set_reduction_config(self.reduction_config)

    def set_save_config(self, save_config: SaveConfig) -> None:
        self.save_config = save_config

    def set_reduction_config(self, reduction_config: ReductionConfig) -> None:
        """smdebug's reductions, as this collection's statistics (and full tensors if raw)."""
        if not isinstance(reduction_config, ReductionConfig):
            raise TypeError(f"expected a ReductionConfig, got {type(reduction_config).__name__}")
        self.reduction_config = reduction_config
        self.statistics = reduction_config.statistics() or None
        if reduction_config.save_raw_tensor:
            self.save_full = True

    # smdebug's Collection methods ----------------------------------------------------------
    def include(self, regex: str | Sequence[str]) -> None:
        """Add include regexes (smdebug's ``Collection.include``): matching tensors join it."""
        items = [regex] if isinstance(regex, str) else list(regex)
        for item in items:
            if not isinstance(item, str):
                raise TypeError(f"include() takes regex strings, got {type(item).__name__}")
            _check_regex(item)
            if item not in self.include_regex:
                self.include_regex.append(item)

    def add_tensor_name(self, name: str) -> None:
        self.tensor_names.add(name)

    def add_module_tensors(self, module: Any, inputs: bool = False, outputs: bool = True) -> None:
        """Save a module's inputs and/or outputs in this collection (smdebug's PyTorch API).

        Their names are smdebug's: ``<module name>_input_<i>``/``<module name>_output_<i>``,
        the module name being its ``named_modules()`` path in the registered model (the
        model itself: its class name).
        """
        self.modules[id(module)] = (module, bool(inputs), bool(outputs))

    def copy(self) -> Collection:
        """A copy that shares registered modules (never deep-copied: they are the user's)."""
        out = copy.copy(self)
        out.include_regex = list(self.include_regex)
        out.tensor_names = set(self.tensor_names)
        out.modules = dict(self.modules)
        return out

    def reductions(self) -> list[str]:
        out = ["mean", "std", "min", "max", "mean_abs", "l1", "l2", "zeros", "nan", "inf", "numel"]
        if self.percentiles:
            out.append("percentiles")
        if self.histogram_bins:
            out.append("histogram")
        if self.unit_active:
            out.append("unit_active")
        if self.unit_band:
            out.append("unit_in_band")
        if self.values:
            out.append("values")
        if self.value_counts:
            out.append("value_counts")
        if self.update_norm:
            out.append("update_l2")
        return out


def _check_regex(regex: str) -> None:
    try:
        re.compile(regex)
    except re.error as exc:
        raise ValueError(f"invalid include regex {regex!r}: {exc}") from None


def _check_statistics(names: Iterable[str]) -> tuple[str, ...]:
    from trainguard.format.documents import TensorStats

    items = (names,) if isinstance(names, str) else tuple(names)
    if items == ("all",):
        return items
    unknown = [n for n in items if n not in TensorStats.model_fields]
    if unknown:
        raise ValueError(f"unknown statistics {unknown}; known: {list(TensorStats.model_fields)} or ('all',)")
    return items


def default_collection(name: str) -> Collection:
    """The built-in definition of a collection (a user-defined name gets plain statistics)."""
    k = CollectionKeys
    scalar = SaveConfig(save_interval=DEFAULT_SCALAR_INTERVAL)
    tensors = SaveConfig(save_interval=DEFAULT_TENSOR_INTERVAL)
    if name in k.SCALAR_COLLECTIONS:
        return Collection(name, scalar)
    if name == k.GRADIENTS:
        return Collection(name, tensors, percentiles=GRADIENT_PERCENTILES)
    if name == k.RELU_OUTPUT:
        return Collection(name, tensors, unit_active=True)
    if name == k.TANH_INPUT:
        return Collection(name, tensors, unit_band=TANH_BAND)
    if name == k.SIGMOID_INPUT:
        return Collection(name, tensors, unit_band=SIGMOID_BAND)
    if name in (k.LABELS, k.PREDICTIONS):
        # ClassImbalance and Confusion count classes: they need the values, which are small.
        return Collection(name, tensors, values=True)
    if name in (k.INPUTS, k.DEFAULT):
        # token ids: NLPSequenceRatio counts them (float inputs are unaffected)
        return Collection(name, tensors, value_counts=True)
    return Collection(name, tensors)


def build_collections(
    include_collections: Iterable[str] | None,
    include_regex: Sequence[str] | None,
    save_config: SaveConfig | None,
    overrides: Iterable[Collection] | None,
) -> dict[str, Collection]:
    """The hook's collections: built-ins (or those included), overrides, and ``default``.

    A hook-wide ``save_config`` applies to every collection that was not given its own
    (smdebug's precedence). An override of a built-in collection keeps the built-in
    reductions it leaves at their defaults (``Collection("gradients", save_full=True)``
    still gets percentiles); to drop one, edit ``hook.get_collection(name)`` afterwards.
    """
    names = list(CollectionKeys.DEFAULT_INCLUDED if include_collections is None else include_collections)
    out: dict[str, Collection] = {}
    for name in names:
        col = default_collection(name)
        if save_config is not None:
            col.save_config = save_config
        out[name] = col
    if include_regex:
        col = default_collection(CollectionKeys.DEFAULT)
        col.include_regex = list(include_regex)
        if save_config is not None:
            col.save_config = save_config
        out[CollectionKeys.DEFAULT] = col
    for override in overrides or ():
        if not isinstance(override, Collection):
            raise TypeError(f"collections= takes Collection objects, got {type(override).__name__}")
        col = override.copy()
        _keep_builtin_reductions(col)
        if col.save_config is None:
            col.save_config = save_config or default_collection(col.name).save_config
        out[col.name] = col
    return out


_REDUCTION_FIELDS = ("percentiles", "histogram_bins", "unit_active", "unit_band", "values", "value_counts")


def _keep_builtin_reductions(col: Collection) -> None:
    if col.name not in CollectionKeys.BUILT_IN:
        return
    builtin = default_collection(col.name)
    blank = Collection(col.name)
    for name in _REDUCTION_FIELDS:
        if getattr(col, name) == getattr(blank, name):
            setattr(col, name, getattr(builtin, name))
