"""PyTorch integration: module hooks that feed ``Hook`` (imported only on ``register_module``).

What is hooked, and why this way:

* **Top module forward pre-hook**: advances the step (each forward after the first, like
  smdebug), checks the stop signal at this safe point, decides once which collections are
  due, and saves weights/biases (the values this forward uses) and model inputs.
* **Gradients**: a tensor hook per parameter (``Tensor.register_hook``), called by
  autograd with the gradient during ``backward()``. Reading ``param.grad`` at the next
  forward would be cheaper still, but the usual loop calls ``optimizer.zero_grad()``
  *before* the forward, so the gradients are gone by then. On a step that is not due
  the tensor hook returns at once (one Python call per parameter per backward).
  Under DDP these are the local gradients, before the all-reduce.
* **Activations**: forward hooks on ``nn.ReLU``/``nn.ReLU6`` (``relu_output``,
  ``relu_input``), ``nn.Tanh`` (``tanh_input``) and ``nn.Sigmoid`` (``sigmoid_input``)
  modules, registered only when those collections are saved. Functional calls
  (``F.relu``) cannot be seen; use modules for the layers you want checked. A module
  called several times in one forward gets ``_1``, ``_2``... suffixes.
* **Loss**: ``register_loss`` adds a forward hook on the loss module: its output goes to
  ``losses`` as ``<LossClass>_output_0`` (smdebug's name); its inputs to ``predictions``
  and ``labels`` when included.

Tensor names: parameters by their ``named_parameters()`` name (``fc1.weight``), gradients
``gradient/<param>`` (smdebug's), activations ``<module>/relu_output`` etc. (matching the
rules' ``.*relu_output`` regexes), model inputs/outputs ``model_input_<i>``/``model_output_<i>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from trainguard.hook.config import CollectionKeys as K
from trainguard.hook.core import Hook, StopTrainingRequested

_ACTIVATION_COLLECTIONS = frozenset({K.RELU_OUTPUT, K.RELU_INPUT, K.TANH_INPUT, K.SIGMOID_INPUT, K.DEFAULT})


class TorchIntegration:
    def __init__(self, hook: Hook) -> None:
        import torch

        self.torch = torch
        self.hook = hook
        hook._framework("pytorch", str(torch.__version__))
        self.handles: list[Any] = []
        self.top: Any = None
        self._seen_forward = False
        self._params: list[tuple[str, Any, str]] = []
        self._regex_params: list[tuple[str, Any]] = []
        self._act_due = False
        self._grad_due = False
        self._calls: dict[str, int] = {}
        self._calls_key: Any = None
        self._regex = [re.compile(r) for r in hook.include_regex]

    def _matches(self, name: str) -> bool:
        return any(p.match(name) for p in self._regex)

    # ------------------------------------------------------------------ registration
    def register_module(self, module: Any) -> None:
        nn = self.torch.nn
        if not isinstance(module, nn.Module):
            raise TypeError(f"register_module needs a torch.nn.Module, got {type(module).__name__}")
        if self.top is not None:
            if module is self.top:
                return
            raise ValueError("a hook follows one top module; register the outer model once")
        self.top = module
        cols = self.hook.collections
        self.handles.append(module.register_forward_pre_hook(self._guard(self._pre_forward)))
        if K.OUTPUTS in cols or self._regex:
            self.handles.append(module.register_forward_hook(self._guard(self._post_forward)))
        for index, (name, param) in enumerate(module.named_parameters()):
            self.hook._order[name] = index
            self.hook._order[f"gradient/{name}"] = index
            col = K.BIASES if name.endswith("bias") else K.WEIGHTS
            if col in cols:
                self._params.append((name, param, col))
            elif self._matches(name):
                self._regex_params.append((name, param))
            grad_name = f"gradient/{name}"
            if param.requires_grad and (K.GRADIENTS in cols or self._matches(grad_name)):
                target = K.GRADIENTS if K.GRADIENTS in cols else K.DEFAULT
                self.handles.append(param.register_hook(self._guard(self._make_grad_hook(grad_name, target))))
        for qual, sub in module.named_modules():
            if sub is module:
                continue
            kind = self._activation_kind(sub)
            wants_regex = bool(self._regex) and (
                self._matches(f"{qual}_input_0") or self._matches(f"{qual}_output_0")
            )
            if (kind is not None and self._kind_collections(kind) & cols.keys()) or wants_regex:
                self.handles.append(
                    sub.register_forward_hook(self._guard(self._make_act_hook(qual, kind, wants_regex)))
                )

    def register_loss(self, loss_module: Any) -> None:
        if not isinstance(loss_module, self.torch.nn.Module):
            raise TypeError(
                "register_loss needs a torch.nn.Module (e.g. nn.CrossEntropyLoss()), "
                f"got {type(loss_module).__name__}; "
                "for a functional loss call hook.save_scalar(name, loss, collections=['losses'])"
            )
        name = f"{type(loss_module).__name__}_output_0"
        self.handles.append(loss_module.register_forward_hook(self._guard(self._make_loss_hook(name))))

    def remove(self) -> None:
        handles, self.handles = self.handles, []
        for handle in handles:
            handle.remove()

    def _activation_kind(self, sub: Any) -> str | None:
        nn = self.torch.nn
        if isinstance(sub, nn.ReLU | nn.ReLU6):
            return "relu"
        if isinstance(sub, nn.Tanh):
            return "tanh"
        if isinstance(sub, nn.Sigmoid):
            return "sigmoid"
        return None

    @staticmethod
    def _kind_collections(kind: str | None) -> set[str]:
        return {
            "relu": {K.RELU_OUTPUT, K.RELU_INPUT},
            "tanh": {K.TANH_INPUT},
            "sigmoid": {K.SIGMOID_INPUT},
        }.get(kind or "", set())

    # ------------------------------------------------------------------ callbacks
    def _guard(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        hook = self.hook

        def inner(*args: Any) -> Any:
            if hook._disabled:
                return None
            try:
                fn(*args)
            except StopTrainingRequested:
                raise
            except Exception as exc:
                hook._disable(exc, where=f"a PyTorch hook ({getattr(fn, '__name__', 'callback')})")
            return None

        return inner

    def _enter(self) -> frozenset[str] | None:
        hook = self.hook
        due = hook._enter(None, None)
        active = due or frozenset()
        self._act_due = bool(active & _ACTIVATION_COLLECTIONS)
        self._grad_due = K.GRADIENTS in active or K.DEFAULT in active
        if self._calls_key != hook._entered:
            self._calls_key = hook._entered
            self._calls = {}
        return due

    def _pre_forward(self, module: Any, args: Any) -> None:
        hook = self.hook
        if self._seen_forward:
            hook.advance_step()  # checks the stop signal; raises StopTrainingRequested at most once
            if hook._disabled:
                return
        else:
            self._seen_forward = True
            hook._check_stop()
            with hook._lock:
                hook._time_step()
        with hook._lock:
            due = self._enter()
            if not due:
                return
            for name, param, col in self._params:
                if col in due:
                    hook._save_tensor_now(name, param, [hook.collections[col]])
            if K.DEFAULT in due:
                for name, param in self._regex_params:
                    hook._save_tensor_now(name, param, [hook.collections[K.DEFAULT]])
            if K.INPUTS in due:
                for i, value in enumerate(args if isinstance(args, tuple) else (args,)):
                    if isinstance(value, self.torch.Tensor):
                        hook._save_tensor_now(f"model_input_{i}", value, [hook.collections[K.INPUTS]])

    def _post_forward(self, module: Any, args: Any, output: Any) -> None:
        hook = self.hook
        with hook._lock:
            due = self._enter()
            if not due or K.OUTPUTS not in due:
                return
            outputs = output if isinstance(output, tuple | list) else (output,)
            for i, value in enumerate(outputs):
                if isinstance(value, self.torch.Tensor):
                    hook._save_tensor_now(f"model_output_{i}", value, [hook.collections[K.OUTPUTS]])

    def _make_grad_hook(self, name: str, target: str) -> Callable[[Any], None]:
        hook = self.hook

        def on_grad(grad: Any) -> None:
            if not self._grad_due:
                return
            with hook._lock:
                due = self._enter()
                if due and target in due:
                    hook._save_tensor_now(name, grad, [hook.collections[target]])

        on_grad.__name__ = "gradient hook"
        return on_grad

    def _make_act_hook(self, qual: str, kind: str | None, regex: bool) -> Callable[..., None]:
        hook = self.hook
        collections = hook.collections

        def on_forward(module: Any, inputs: Any, output: Any) -> None:
            if not self._act_due:
                return
            with hook._lock:
                due = self._enter()
                if not due:
                    return
                count = self._calls.get(qual, 0)
                self._calls[qual] = count + 1
                suffix = f"_{count}" if count else ""
                first_in = inputs[0] if isinstance(inputs, tuple) and inputs else inputs
                saves: list[tuple[str, Any, str]] = []
                if kind == "relu":
                    saves += [(f"{qual}/relu_output{suffix}", output, K.RELU_OUTPUT)]
                    saves += [(f"{qual}/relu_input{suffix}", first_in, K.RELU_INPUT)]
                elif kind == "tanh":
                    saves += [(f"{qual}/tanh_input{suffix}", first_in, K.TANH_INPUT)]
                elif kind == "sigmoid":
                    saves += [(f"{qual}/sigmoid_input{suffix}", first_in, K.SIGMOID_INPUT)]
                if regex and K.DEFAULT in due:
                    for name, value in ((f"{qual}_input_0", first_in), (f"{qual}_output_0", output)):
                        if self._matches(name):
                            saves.append((name + suffix, value, K.DEFAULT))
                for name, value, col in saves:
                    if col in due and isinstance(value, self.torch.Tensor):
                        hook._save_tensor_now(name, value, [collections[col]])

        on_forward.__name__ = f"activation hook on {qual}"
        return on_forward

    def _make_loss_hook(self, name: str) -> Callable[..., None]:
        hook = self.hook
        collections = hook.collections

        def on_loss(module: Any, inputs: Any, output: Any) -> None:
            with hook._lock:
                due = self._enter()
                if not due:
                    return
                if K.LOSSES in due and isinstance(output, self.torch.Tensor) and output.numel() == 1:
                    from trainguard.hook.core import _scalar

                    hook._mode_buffer().scalars[name] = (_scalar(output), [K.LOSSES])
                prefix = name.removesuffix("_output_0")
                args = inputs if isinstance(inputs, tuple) else (inputs,)
                for index, col in ((0, K.PREDICTIONS), (1, K.LABELS)):
                    if col in due and len(args) > index and isinstance(args[index], self.torch.Tensor):
                        hook._save_tensor_now(f"{prefix}/{col}", args[index], [collections[col]])

        on_loss.__name__ = "loss hook"
        return on_loss
