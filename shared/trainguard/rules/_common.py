"""Helpers shared by the model rules: SageMaker parameter types, tensor and loss selection.

Not a rule module (it defines no ``Rule`` subclass), so the registry guard ignores it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from trainguard.format.documents import Mode, TensorStats
from trainguard.rules.base import RuleInput, StepData, TensorView, compiled
from trainguard.rules.regex import RegexError

#: SageMaker's order when a rule's ``mode`` is None: EVAL, else TRAIN, else GLOBAL
MODE_PRIORITY: tuple[Mode, ...] = ("EVAL", "TRAIN", "GLOBAL")
#: the model's parameters and their gradients: trainguard's default selection for the rules
#: whose SageMaker documentation requires a selection (AllZero, UnchangedTensor)
PARAMETER_COLLECTIONS: tuple[str, ...] = ("weights", "biases", "gradients")


def split_list(value: Any) -> Any:
    """SageMaker passes lists as one comma-separated string ("weights,gradients").

    Commas inside ``{}``, ``[]`` or ``()`` belong to a regex (``a{1,3}``) and do not split.
    """
    if value is None or not isinstance(value, str):
        return value
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for char in value:
        if char in "{[(":
            depth += 1
        elif char in "}])" and depth:
            depth -= 1
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    cleaned = tuple(item.strip() for item in items if item.strip())
    return cleaned or None


def _check_regexes(value: tuple[str, ...] | None) -> tuple[str, ...] | None:
    for pattern in value or ():
        _check_regex(pattern)
    return value


def _check_regex(pattern: str) -> str:
    """A job's pattern must compile for bounded-time matching (``trainguard.rules.regex``)."""
    try:
        compiled(pattern)
    except RegexError as exc:
        raise ValueError(str(exc)) from None
    return pattern


#: a comma-separated list of names ("None" or "" for none)
NameList = Annotated[tuple[str, ...] | None, BeforeValidator(split_list)]
#: a comma-separated list of regular expressions, each checked to compile
RegexList = Annotated[tuple[str, ...] | None, BeforeValidator(split_list), AfterValidator(_check_regexes)]
#: one regular expression, checked to compile
Regex = Annotated[str, AfterValidator(_check_regex)]
#: a finite float ("NaN" and "Infinity" are configuration errors)
Finite = Annotated[float, Field(allow_inf_nan=False)]
NonNegative = Annotated[float, Field(allow_inf_nan=False, ge=0)]
Percent = Annotated[float, Field(allow_inf_nan=False, ge=0, le=100)]
PositiveInt = Annotated[int, Field(ge=1)]
Probability = Annotated[float, Field(allow_inf_nan=False, ge=0, le=1)]


def select(
    step: StepData,
    collections: Sequence[str] | None,
    regex: Sequence[str] | str | None,
    mode: Mode | None = None,
    *,
    default_collections: Sequence[str] | None = None,
) -> Iterator[tuple[TensorView, TensorStats]]:
    """Tensors with statistics chosen by ``collection_names``/``tensor_regex``.

    When neither is given, ``default_collections`` is used (None: every tensor).
    """
    if not collections and not regex:
        collections = default_collections
    for view in step.tensors(mode, collections, regex):
        if view.stats is not None:
            yield view, view.stats


def describe_selection(collections: Sequence[str] | None, regex: Sequence[str] | None, noun: str) -> str:
    """``tensors in weights, gradients or matching 'fc.*'`` for a coverage message."""
    parts = []
    if collections:
        parts.append(f"in {', '.join(collections)}")
    if regex:
        parts.append(f"matching {', '.join(repr(r) for r in regex)}")
    return f"{noun} {' or '.join(parts)}" if parts else f"saved {noun}"


def tensor_input(
    collections: Sequence[str] | None,
    regex: Sequence[str] | None,
    statistics: Sequence[str],
    *,
    default_collections: Sequence[str] | None = None,
    what: str | None = None,
    modes: Sequence[Mode] = (),
    required: bool = True,
) -> RuleInput:
    """The ``RuleInput`` of a ``collection_names``/``tensor_regex`` selection (see ``select``)."""
    if not collections and not regex:
        collections = default_collections
    return RuleInput(
        what or describe_selection(collections, regex, "tensors"),
        collections=tuple(collections or ()),
        regex=tuple(regex or ()),
        statistics=tuple(statistics),
        modes=tuple(modes),
        required=required,
    )


def loss_inputs(
    modes: Sequence[Mode],
    *,
    collections: Sequence[str] | None = None,
    regex: Sequence[str] | None = None,
    use_losses_collection: bool = True,
    required: bool = True,
    what: str | None = None,
) -> tuple[RuleInput, ...]:
    """The inputs ``loss_value`` reads: loss scalars, and tensors chosen by name (their mean)."""
    cols = (("losses",) if use_losses_collection else ()) + tuple(collections or ())
    label = what or f"{'/'.join(modes) + ' ' if modes else ''}losses"
    out = [
        RuleInput(
            label,
            collections=cols,
            regex=tuple(regex or ()),
            scalars=True,
            modes=tuple(modes),
            required=required,
        )
    ]
    if collections or regex:
        out.append(
            RuleInput(
                f"{label} saved as tensors",
                collections=tuple(collections or ()),
                regex=tuple(regex or ()),
                statistics=("numel", "mean"),
                modes=tuple(modes),
                required=False,
            )
        )
    return tuple(out)


def loss_value(
    step: StepData,
    mode: Mode,
    *,
    collections: Sequence[str] | None = None,
    regex: Sequence[str] | None = None,
    use_losses_collection: bool = True,
) -> float | None:
    """The step's loss in ``mode``: mean over workers and over every selected loss.

    Selected: scalars in the ``losses`` collection (when ``use_losses_collection``), in any of
    ``collections`` or with a name matching any of ``regex``; and tensors in ``collections`` or
    matching ``regex`` (their mean; a tensor whose ``mean`` or ``numel`` was not computed is
    not a loss received). Non-finite losses are kept (they are what went wrong).
    """
    patterns = [compiled(r) for r in regex or ()]
    wanted = set(collections or ())
    values: list[float] = []
    for _, name, _, scalar in step.scalars(mode):
        cols = set(scalar.collections)
        if (
            (use_losses_collection and "losses" in cols)
            or (wanted & cols)
            or any(p.match(name) for p in patterns)
        ):
            values.append(scalar.value)
    if wanted or patterns:
        for view in step.tensors(mode, list(wanted) or None, list(regex or ()) or None):
            stats = view.stats
            if stats is not None and stats.numel and stats.mean is not None:
                values.append(stats.mean)
    return sum(values) / len(values) if values else None


def missing_statistic(received: int, noun: str, *statistics: str) -> str:
    """The coverage reason when inputs arrived but none could be judged."""
    if not received:
        return ""
    needed = " and ".join(f"'{s}'" for s in statistics)
    return (
        f"{received:,} {noun} arrived, none with a usable {needed} statistic (empty, not finite, or "
        "not computed by the hook: a hook configured before this rule was added does not compute it)"
    )


def mode_step(step: StepData, mode: Mode) -> int:
    """The step number within ``mode`` (the first worker's), or the global step."""
    for header in step.workers:
        record = header.modes.get(mode)
        if record is not None:
            return record.mode_step
    return step.step


class TrainingClock(BaseModel):
    """The training step each step belongs to: the clock every window and patience counts.

    A step with TRAIN data: its TRAIN mode step (the training steps before it). An EVAL or
    PREDICT step: the last training step seen, so an evaluation belongs to the training step it
    followed however many EVAL steps it took. A job that never saved TRAIN data (GLOBAL only:
    XGBoost rounds, a loop without modes): its GLOBAL mode step, else the global step. Global
    steps are not used as such: the PyTorch hook advances them on every forward, EVAL batches
    included, so their spacing depends on how long and how often evaluations are.

    Kept in a rule's state (two numbers).
    """

    model_config = ConfigDict(extra="forbid")

    last: int | None = None
    trained: bool = False

    def tick(self, step: StepData) -> int:
        train = _mode_step(step, "TRAIN")
        if train is not None:
            self.last, self.trained = train, True
            return train
        if not self.trained:
            glob = _mode_step(step, "GLOBAL")
            if glob is not None or self.last is None:
                self.last = glob if glob is not None else step.step
        assert self.last is not None
        return self.last


def _mode_step(step: StepData, mode: Mode) -> int | None:
    for header in step.workers:
        record = header.modes.get(mode)
        if record is not None:
            return record.mode_step
    return None


def finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))


def class_ids(view: TensorView, argmax: bool = False) -> list[int] | None:
    """Class ids from a small tensor's ``values`` statistic (None when the hook sent none).

    ``argmax``: the tensor holds scores of shape ``(N, C)``; the id is each row's argmax.
    Otherwise the values are ids already (rounded; non-finite values are dropped).
    """
    stats = view.stats
    if stats is None or stats.values is None:
        return None
    values = stats.values
    if argmax:
        shape = view.record.shape
        width = shape[-1] if len(shape) >= 2 and shape[-1] > 0 else 0
        if not width or len(values) % width:
            return None
        rows = (values[i : i + width] for i in range(0, len(values), width))
        return [max(range(width), key=row.__getitem__) for row in rows]
    return [round(v) for v in values if finite(v)]
