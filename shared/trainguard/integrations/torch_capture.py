"""Tensors of a PyTorch model for the Hugging Face and Lightning callbacks.

* **Weights and biases** (``weights``/``biases``, by ``named_parameters()`` name) and
  **gradients** (``gradients``, ``gradient/<param>``, smdebug's name) are read at the
  optimizer step, once the gradients of the whole step are there (after gradient
  accumulation; under DDP after the all-reduce, so every rank sees the same values) and
  before the update: the weights are the values the step's forwards used. Tensors are
  reduced on their device by the hook; a sharded parameter (a DTensor, FSDP2) is reduced
  on this rank's shard, never with a collective.
* **Activations** (``relu_output``, ``relu_input``, ``tanh_input``, ``sigmoid_input``):
  forward hooks on ``nn.ReLU``/``nn.ReLU6``/``nn.Tanh``/``nn.Sigmoid`` modules, registered
  only for the collections the hook saves, recording the first training batch of a due
  step (under gradient accumulation, its first micro-batch; the callback calls
  ``new_batch()`` as each one begins). Functional calls (``F.relu``)
  and fused activations (GELU inside a transformer block) cannot be seen.
* **include_regex**: parameters and ``gradient/<param>`` names matching the hook's
  ``include_regex`` go to the ``default`` collection.

Every save goes through ``HookAdapter``; nothing here calls the hook.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Any

from trainguard.hook.config import CollectionKeys as K
from trainguard.integrations.adapter import HookAdapter
from trainguard.modes import ModeKeys

#: what a torch-based callback can capture (``Hook.add_framework``'s ``produces``)
_ACTIVATIONS = {
    "relu": (K.RELU_OUTPUT, K.RELU_INPUT),
    "tanh": (K.TANH_INPUT,),
    "sigmoid": (K.SIGMOID_INPUT,),
}
PRODUCES = (
    K.LOSSES, K.METRICS, K.WEIGHTS, K.BIASES, K.GRADIENTS, K.DEFAULT,
    *(c for cols in _ACTIVATIONS.values() for c in cols),
)  # fmt: skip


def safe(fn: Callable[..., None], on_error: Callable[[BaseException, str], None]) -> Callable[..., None]:
    """A module hook that reports its exception to ``on_error`` instead of raising into forward."""

    def inner(*args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            on_error(exc, getattr(fn, "__name__", "a module hook"))

    return inner


def local_tensor(value: Any) -> Any:
    """This rank's part of a distributed tensor (DTensor), the tensor itself otherwise."""
    to_local = getattr(value, "to_local", None)
    return to_local() if callable(to_local) else value


class TorchCapture:
    """Weights, biases, gradients and activations of one ``torch.nn.Module``.

    Parameters
    ----------
    adapter
        Where the tensors go.
    on_error
        Called with the exception and where it happened when a module hook fails; the
        hooks never let an exception into the model's forward.
    """

    def __init__(self, adapter: HookAdapter, on_error: Callable[[BaseException, str], None]) -> None:
        self.adapter = adapter
        self.on_error = on_error
        self.model: Any = None
        #: (name, parameter, weights-or-biases collection, matches include_regex)
        self._params: list[tuple[str, Any, str, bool, bool]] = []
        self._handles: list[Any] = []
        self._step: int | None = None
        self._act_due: tuple[str, ...] = ()
        self._forwards = 0
        self._calls: dict[str, int] = {}

    # ------------------------------------------------------------------ attaching
    def attach(self, model: Any) -> None:
        """Follow ``model`` (again after a change of model); the hook must exist."""
        if model is self.model:
            return
        self.detach()
        self.model = model
        regex = [re.compile(r) for r in self.adapter.include_regex]
        self._params = []
        for name, param in model.named_parameters():
            col = K.BIASES if name.endswith("bias") else K.WEIGHTS
            self._params.append(
                (
                    name,
                    param,
                    col,
                    any(p.match(name) for p in regex),
                    any(p.match(f"gradient/{name}") for p in regex),
                )
            )
        kinds = {kind for kind, cols in _ACTIVATIONS.items() if any(self.adapter.included(c) for c in cols)}
        if not kinds:
            return
        for qual, sub in model.named_modules():
            kind = self._kind(sub)
            if kind in kinds:
                hook = safe(self._activation_hook(qual or "model", kind), self.on_error)
                self._handles.append(sub.register_forward_hook(hook))

    def detach(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self.model = None
        self._params = []

    @staticmethod
    def _kind(module: Any) -> str | None:
        from torch import nn

        if isinstance(module, nn.ReLU | nn.ReLU6):
            return "relu"
        if isinstance(module, nn.Tanh):
            return "tanh"
        if isinstance(module, nn.Sigmoid):
            return "sigmoid"
        return None

    # ------------------------------------------------------------------ steps
    def begin_step(self, step: int) -> None:
        """A new training step: decide once which activation collections it records."""
        if step == self._step:
            return
        self._step = step
        self._forwards = 0
        self._act_due = tuple(
            c for cols in _ACTIVATIONS.values() for c in cols if self.adapter.due(c, ModeKeys.TRAIN, step)
        )

    def save_parameters(self, step: int, only: Collection[int] | None = None) -> None:
        """Weights and biases due at ``step`` (``only``: ids of the parameters to consider)."""
        adapter = self.adapter
        due = {c for c in (K.WEIGHTS, K.BIASES, K.DEFAULT) if adapter.due(c, ModeKeys.TRAIN, step)}
        if not due:
            return
        for name, param, col, regex, _ in self._params:
            if only is not None and id(param) not in only:
                continue
            if col in due:
                adapter.tensor(name, local_tensor(param), step=step, mode=ModeKeys.TRAIN, collection=col)
            elif regex and K.DEFAULT in due:
                adapter.tensor(
                    name, local_tensor(param), step=step, mode=ModeKeys.TRAIN, collection=K.DEFAULT
                )

    def save_gradients(self, step: int, only: Collection[int] | None = None) -> None:
        """``gradient/<param>`` of every parameter with a gradient, if due at ``step``."""
        adapter = self.adapter
        grads_due = adapter.due(K.GRADIENTS, ModeKeys.TRAIN, step)
        default_due = adapter.due(K.DEFAULT, ModeKeys.TRAIN, step)
        if not grads_due and not default_due:
            return
        for name, param, _, _, regex in self._params:
            if only is not None and id(param) not in only:
                continue
            grad = param.grad
            if grad is None:
                continue
            if grads_due:
                collection = K.GRADIENTS
            elif regex:
                collection = K.DEFAULT
            else:
                continue
            adapter.tensor(
                f"gradient/{name}", local_tensor(grad), step=step, mode=ModeKeys.TRAIN, collection=collection
            )

    def new_batch(self) -> None:
        """A training (micro-)batch begins: activations are recorded for a step's first one."""
        self._forwards += 1
        self._calls = {}

    # ------------------------------------------------------------------ activations
    def _activation_hook(self, qual: str, kind: str) -> Callable[[Any, Any, Any], None]:
        adapter = self.adapter

        def on_forward(module: Any, inputs: Any, output: Any) -> None:
            if not self._act_due or self._forwards != 1 or not module.training or self._step is None:
                return
            count = self._calls.get(qual, 0)
            self._calls[qual] = count + 1
            suffix = f"_{count}" if count else ""
            first = inputs[0] if isinstance(inputs, tuple) and inputs else inputs
            saves: tuple[tuple[str, Any], ...]
            if kind == "relu":
                saves = ((K.RELU_OUTPUT, output), (K.RELU_INPUT, first))
            else:
                saves = ((f"{kind}_input", first),)
            for col, value in saves:
                if col in self._act_due:
                    adapter.tensor(
                        f"{qual}/{col}{suffix}", value, step=self._step, mode=ModeKeys.TRAIN, collection=col
                    )

        on_forward.__name__ = f"activation hook on {qual}"
        return on_forward


def any_rank(flag: bool, device: Any, world_size: int) -> bool:
    """``flag`` of any process, so every rank takes the same decision at the same step.

    One 1-element all-reduce on ``device`` when ``torch.distributed`` runs more than one
    process (every rank must call this at the same points); ``flag`` itself otherwise.
    """
    if world_size <= 1:
        return flag
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)
