"""PyTorch integration: module hooks that feed ``Hook`` (imported only on ``register_module``).

It uses only the hook's public recording interface (``plan``, ``record_tensors``,
``record_scalar``, ``collections_for``, ``check_stop``, ``advance_step``, ``guard``,
``add_framework``, ``set_tensor_order``). What is hooked, and why this way:

* **Top module forward pre-hook** (always): advances the step (each forward after the first,
  like smdebug), checks the stop signal at this safe point, asks the hook what is due, and
  records weights/biases (the values this forward uses) and model inputs. On a step where
  nothing is due that is all that runs: a few Python calls per step.
* Everything else is installed **only on steps where it is due**, and removed at the next
  step, so a step with nothing due keeps PyTorch's hook-free fast path in every submodule:
* **Gradients**: on a due step, a hook on the model's output tensor queues one callback at
  the end of ``backward()`` (autograd's ``queue_callback``), which records every parameter's
  ``.grad`` in one batch (``Hook.record_tensors``: one pass per gradient, ``_foreach``
  kernels on an accelerator) instead of a Python hook per parameter. These are the gradients
  the optimizer will apply (after DDP's all-reduce; accumulated, under gradient
  accumulation). Where ``queue_callback`` is unavailable, a multi-gradient hook over the
  parameters is used instead (the incoming gradients).
* **Activations**: forward hooks on ``nn.ReLU``/``nn.ReLU6`` (``relu_output``,
  ``relu_input``), ``nn.Tanh`` (``tanh_input``) and ``nn.Sigmoid`` (``sigmoid_input``).
  Functional calls (``F.relu``) cannot be seen; use modules for the layers you want checked.
  An in-place ReLU (``nn.ReLU(inplace=True)``) overwrites its input, so its ``relu_input``
  is read by a forward pre-hook, before it runs.
  A module called several times in one forward gets ``_1``, ``_2``... suffixes.
* **Module inputs/outputs** (smdebug's ``<module>_input_<i>``/``<module>_output_<i>``) for
  modules a collection asks for: ``include_regex`` matching those names, ``save_all``,
  ``Collection.add_module_tensors``.
* **Loss** (always, once registered): ``register_loss`` adds a forward hook on the loss
  module: its output goes to ``losses`` as ``<LossClass>_output_0`` (smdebug's name); its
  inputs to ``predictions`` and ``labels`` when those are due.

Tensor names are smdebug's: parameters ``<Model>_<named_parameters() name>``
(``Net_fc1.weight``), gradients ``gradient/<that>``, model inputs/outputs
``<Model>_input_<i>``/``<Model>_output_<i>``, submodule inputs/outputs
``<qualified name>_input_<i>``/``_output_<i>`` (``<Model>`` is the class name of the
registered module); activations ``<qualified name>/relu_output`` etc. (matching the rules'
``.*relu_output`` regexes); the loss module's inputs ``<LossClass>/predictions`` and
``<LossClass>/labels`` (ClassImbalance's ``.*labels``/``.*predictions``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.hook.config import CollectionKeys as K
from trainguard.hook.core import Hook
from trainguard.hook.steps import StepPlan
from trainguard.hook.torch_structure import NormTrace, static_structure, unused

_KIND_COLLECTIONS: dict[str, tuple[str, ...]] = {
    "relu": (K.RELU_OUTPUT, K.RELU_INPUT),
    "tanh": (K.TANH_INPUT,),
    "sigmoid": (K.SIGMOID_INPUT,),
}


@dataclass
class _Param:
    name: str
    grad_name: str
    param: Any
    #: the ``named_parameters()`` name (``fc1.weight``): regexes may be written against it
    plain: str = ""
    collections: tuple[str, ...] = ()
    grad_collections: tuple[str, ...] = ()


@dataclass
class _Module:
    qual: str
    module: Any
    kind: str | None
    #: collections of its ``_input_<i>``/``_output_<i>`` tensors (regex collections)
    io_collections: tuple[str, ...] = ()


class TorchIntegration:
    def __init__(self, hook: Hook) -> None:
        import torch

        self.torch = torch
        self.hook = hook
        self.top: Any = None
        self.top_name = "Model"
        self._permanent: list[Any] = []
        self._dynamic: list[Any] = []
        self._params: list[_Param] = []
        self._modules: list[_Module] = []
        self._seen_forward = False
        self._resolved = False
        self._plan: StepPlan | None = None
        self._calls: dict[str, int] = {}
        self._grad_pending = False
        self._losses: list[Any] = []
        self._input_collections: dict[str, tuple[str, ...]] = {}
        #: the model's structure (``torch_structure``): traced once, checked at one backward
        self._names: dict[int, str] = {}
        self._traced = False
        self._trace: NormTrace | None = None
        self._trace_handle: Any = None
        self._unused_checked = False
        hook.add_framework("pytorch", str(torch.__version__))

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
        self.top_name = str(module._get_name())  # type: ignore[no-untyped-call]  # smdebug's model name
        order: list[str] = []
        for name, param in module.named_parameters():
            smd = f"{self.top_name}_{name}"
            self._params.append(_Param(smd, f"gradient/{smd}", param, name))
            order.append(smd)
        self.hook.set_tensor_order(order + [p.grad_name for p in self._params])
        self._names = {id(p.param): p.name for p in self._params}
        self._structure(lambda: static_structure(self.torch, module, self._names))
        produced = {K.WEIGHTS, K.BIASES, K.GRADIENTS, K.INPUTS, K.OUTPUTS, K.DEFAULT, K.ALL}
        for qual, sub in module.named_modules():
            if sub is module:
                continue
            kind = self._activation_kind(sub)
            if kind is not None:
                produced.update(_KIND_COLLECTIONS[kind])
            self._modules.append(_Module(qual, sub, kind))
        hook = self.hook
        hook.add_framework("pytorch", str(self.torch.__version__), produces=produced)
        self._permanent.append(
            module.register_forward_pre_hook(hook.guard(self._pre_forward, "a PyTorch hook"))
        )

    def register_loss(self, loss_module: Any) -> None:
        if not isinstance(loss_module, self.torch.nn.Module):
            raise TypeError(
                "register_loss needs a torch.nn.Module (e.g. nn.CrossEntropyLoss()), "
                f"got {type(loss_module).__name__}; "
                "for a functional loss call hook.save_scalar(name, loss)"
            )
        name = str(loss_module._get_name())  # type: ignore[no-untyped-call]
        self._losses.append(loss_module)
        self.hook.add_framework(
            "pytorch", str(self.torch.__version__), produces={K.LOSSES, K.LABELS, K.PREDICTIONS}
        )
        self._permanent.append(
            loss_module.register_forward_hook(self.hook.guard(self._make_loss_hook(name), "the loss hook"))
        )

    def remove(self) -> None:
        self._remove_dynamic()
        if self._trace is not None:
            self._trace.remove()
            self._trace = None
        if self._trace_handle is not None:
            self._trace_handle.remove()
            self._trace_handle = None
        handles, self._permanent = self._permanent, []
        for handle in handles:
            handle.remove()

    def _remove_dynamic(self) -> None:
        handles, self._dynamic = self._dynamic, []
        for handle in handles:
            handle.remove()
        self._grad_pending = False

    def _activation_kind(self, sub: Any) -> str | None:
        nn = self.torch.nn
        if isinstance(sub, nn.ReLU | nn.ReLU6):
            return "relu"
        if isinstance(sub, nn.Tanh):
            return "tanh"
        if isinstance(sub, nn.Sigmoid):
            return "sigmoid"
        return None

    def _resolve(self) -> None:
        """Collections of every name (regexes, ``add_module_tensors``), once, at the first step."""
        self._resolved = True
        hook = self.hook
        quals = {id(m.module): m.qual for m in self._modules}
        quals[id(self.top)] = self.top_name
        for col in hook.collections.values():
            for module, inputs, outputs in col.modules.values():
                qual = quals.get(id(module))
                if qual is None:
                    hook.warn_once(
                        f"module:{col.name}:{id(module)}",
                        "collection %s: add_module_tensors got a module that is not part of the registered "
                        "model; its tensors are not saved",
                        col.name,
                    )
                    continue
                if inputs:
                    col.include("^" + re.escape(qual) + "_input_")
                if outputs:
                    col.include("^" + re.escape(qual) + "_output_")
        hook.collections_changed()
        for p in self._params:
            base = K.BIASES if p.name.endswith("bias") else K.WEIGHTS
            p.collections = hook.collections_for(p.name, (base,), aliases=(p.plain,))
            p.grad_collections = hook.collections_for(
                p.grad_name, (K.GRADIENTS,), aliases=(f"gradient/{p.plain}",)
            )
        for m in self._modules:
            regex_cols = set(hook.collections_for(f"{m.qual}_input_0")) | set(
                hook.collections_for(f"{m.qual}_output_0")
            )
            m.io_collections = tuple(sorted(regex_cols))

    # ------------------------------------------------------------------ callbacks
    def _pre_forward(self, module: Any, args: Any) -> None:
        hook = self.hook
        self._remove_dynamic()
        if self._seen_forward:
            hook.advance_step()  # checks the stop signal; raises StopTrainingRequested at most once
        else:
            self._seen_forward = True
            hook.check_stop()
        if not self._traced and self.torch.is_grad_enabled() and module.training:
            self._start_trace()
        plan = hook.plan()
        if plan is not self._plan:
            self._plan = plan
            self._calls = {}
        if plan is None or not plan.due:
            return
        if not self._resolved:
            self._resolve()
        due = plan.due
        hook.record_tensors(
            (p.name, p.param.detach(), p.collections) for p in self._params if due.intersection(p.collections)
        )
        values = args if isinstance(args, tuple) else (args,)
        inputs = [
            (f"{self.top_name}_input_{i}", v)
            for i, v in enumerate(values)
            if isinstance(v, self.torch.Tensor)
        ]
        hook.record_tensors((n, v, self._top_cols(n, K.INPUTS)) for n, v in inputs)
        self._install(due)

    # ------------------------------------------------------------------ structure
    def _structure(self, find: Callable[[], dict[str, str]]) -> None:
        """Hand what ``find`` learns to the hook; a failure loses the structure, never the hook."""
        try:
            found = find()
        except Exception as exc:  # an odd model: the rules judge every tensor, as without it
            self.hook.warn_once(
                "structure", "cannot read the model's structure (%s); every tensor is judged", exc
            )
            return
        if found:
            self.hook.set_structure(found)

    def _start_trace(self) -> None:
        """Trace this forward (the first with gradients, in training mode) for norm-fed biases."""
        self._traced = True
        trace = NormTrace(self.torch, self.top, self._names)
        if not trace.worthwhile:
            return
        trace.install()
        self._trace = trace
        self._trace_handle = self.top.register_forward_hook(self._end_trace)

    def _end_trace(self, module: Any, args: Any, output: Any) -> None:
        trace, self._trace = self._trace, None
        handle, self._trace_handle = self._trace_handle, None
        if handle is not None:
            handle.remove()
        if trace is not None:
            self._structure(lambda: trace.finish(output))

    def _check_unused(self, params: Sequence[tuple[str, Any]]) -> None:
        """At the first recorded backward: trainable parameters that got no gradient."""
        if not self._unused_checked:
            self._unused_checked = True
            self._structure(lambda: unused(params))

    def _top_cols(self, name: str, base: str) -> tuple[str, ...]:
        cols = self._input_collections.get(name)
        if cols is None:
            cols = self._input_collections[name] = self.hook.collections_for(name, (base,))
        return cols

    def _install(self, due: frozenset[str]) -> None:
        """The hooks this step needs (removed at the next step)."""
        hook = self.hook
        wants_grads = any(due.intersection(p.grad_collections) for p in self._params)
        wants_outputs = bool(due.intersection(self._top_cols(f"{self.top_name}_output_0", K.OUTPUTS)))
        if wants_grads or wants_outputs:
            self._dynamic.append(
                self.top.register_forward_hook(hook.guard(self._post_forward, "a PyTorch hook"))
            )
        if wants_grads and not _can_queue_callback(self.torch):
            self._install_multi_grad(due)
        for m in self._modules:
            kind_due = m.kind is not None and due.intersection(_KIND_COLLECTIONS[m.kind])
            io_due = due.intersection(m.io_collections)
            if kind_due or io_due:
                fn = self._make_module_hook(m)
                self._dynamic.append(m.module.register_forward_hook(hook.guard(fn, f"a hook on {m.qual}")))
            if m.kind == "relu" and _inplace(m.module) and K.RELU_INPUT in due:
                # an in-place ReLU overwrites its input: read it before the forward runs (the
                # reductions are queued on the same stream ahead of the ReLU)
                pre = self._make_inplace_input_hook(m)
                self._dynamic.append(
                    m.module.register_forward_pre_hook(hook.guard(pre, f"a hook on {m.qual}"))
                )

    def _post_forward(self, module: Any, args: Any, output: Any) -> None:
        plan = self._plan
        if plan is None:
            return
        outputs = output if isinstance(output, tuple | list) else (output,)
        tensors = [v for v in outputs if isinstance(v, self.torch.Tensor)]
        self.hook.record_tensors(
            (f"{self.top_name}_output_{i}", v, self._top_cols(f"{self.top_name}_output_{i}", K.OUTPUTS))
            for i, v in enumerate(tensors)
        )
        wants_grads = any(plan.due.intersection(p.grad_collections) for p in self._params)
        if wants_grads and _can_queue_callback(self.torch) and not self._grad_pending:
            target = next((t for t in tensors if t.requires_grad), None)
            if target is not None:
                self._grad_pending = True
                on_grad = self.hook.guard(self._on_output_grad, "the gradient hook")
                self._dynamic.append(target.register_hook(on_grad))  # type: ignore[no-untyped-call]

    def _on_output_grad(self, grad: Any) -> None:
        # backward has started: record the gradients once it has finished
        self.torch.autograd.Variable._execution_engine.queue_callback(
            self.hook.guard(self._after_backward, "the gradient hook")
        )

    def _after_backward(self) -> None:
        self._grad_pending = False
        self._check_unused([(p.name, p.param) for p in self._params])
        self.hook.record_tensors(
            (p.grad_name, p.param.grad, p.grad_collections) for p in self._params if p.param.grad is not None
        )

    def _install_multi_grad(self, due: frozenset[str]) -> None:
        params = [p for p in self._params if p.param.requires_grad and due.intersection(p.grad_collections)]
        if not params:
            return

        def on_grads(grads: Sequence[Any]) -> None:
            # a multi-gradient hook sees None for a parameter the backward did not reach
            self._check_unused([(p.name, p.param) for p, g in zip(params, grads, strict=True) if g is None])
            self.hook.record_tensors(
                (p.grad_name, g, p.grad_collections)
                for p, g in zip(params, grads, strict=True)
                if g is not None
            )

        register = self.torch.autograd.graph.register_multi_grad_hook
        self._dynamic.append(
            register([p.param for p in params], self.hook.guard(on_grads, "the gradient hook"), mode="all")
        )

    def _make_module_hook(self, m: _Module) -> Callable[..., None]:
        def on_forward(module: Any, inputs: Any, output: Any) -> None:
            count = self._calls.get(m.qual, 0)
            self._calls[m.qual] = count + 1
            suffix = f"_{count}" if count else ""
            args = inputs if isinstance(inputs, tuple) else (inputs,)
            first_in = args[0] if args else None
            items: list[tuple[str, Any, Sequence[str]]] = []
            if m.kind == "relu":
                items.append((f"{m.qual}/relu_output{suffix}", output, (K.RELU_OUTPUT,)))
                if not _inplace(module):  # an in-place ReLU's input was read before it ran
                    items.append((f"{m.qual}/relu_input{suffix}", first_in, (K.RELU_INPUT,)))
            elif m.kind == "tanh":
                items.append((f"{m.qual}/tanh_input{suffix}", first_in, (K.TANH_INPUT,)))
            elif m.kind == "sigmoid":
                items.append((f"{m.qual}/sigmoid_input{suffix}", first_in, (K.SIGMOID_INPUT,)))
            if m.io_collections:
                outs = output if isinstance(output, tuple | list) else (output,)
                for kind, values in (("input", args), ("output", outs)):
                    tensors = [v for v in values if isinstance(v, self.torch.Tensor)]
                    for i, v in enumerate(tensors):
                        name = f"{m.qual}_{kind}_{i}{suffix}"
                        items.append((name, v, self.hook.collections_for(name)))
            self.hook.record_tensors(
                (name, value, cols) for name, value, cols in items if isinstance(value, self.torch.Tensor)
            )

        on_forward.__name__ = f"hook on {m.qual}"
        return on_forward

    def _make_inplace_input_hook(self, m: _Module) -> Callable[..., None]:
        def before_forward(module: Any, inputs: Any) -> None:
            count = self._calls.get(m.qual, 0)  # the forward hook counts the call
            suffix = f"_{count}" if count else ""
            args = inputs if isinstance(inputs, tuple) else (inputs,)
            if args and isinstance(args[0], self.torch.Tensor):
                self.hook.record_tensors([(f"{m.qual}/relu_input{suffix}", args[0], (K.RELU_INPUT,))])

        before_forward.__name__ = f"pre-hook on {m.qual}"
        return before_forward

    def _make_loss_hook(self, name: str) -> Callable[..., None]:
        hook = self.hook
        torch = self.torch

        def on_loss(module: Any, inputs: Any, output: Any) -> None:
            plan = hook.plan()
            if plan is not self._plan:
                self._plan = plan
                self._calls = {}
            if plan is None or not plan.due:
                return
            key = f"loss:{name}"
            count = self._calls.get(key, 0)
            self._calls[key] = count + 1
            out_name = f"{name}_output_{count}"
            if isinstance(output, torch.Tensor) and output.numel() == 1:
                hook.record_scalar(out_name, output, hook.collections_for(out_name, (K.LOSSES,)))
            args = inputs if isinstance(inputs, tuple) else (inputs,)
            suffix = f"_{count}" if count else ""
            items = []
            for index, col in ((0, K.PREDICTIONS), (1, K.LABELS)):
                if len(args) > index and isinstance(args[index], torch.Tensor):
                    items.append((f"{name}/{col}{suffix}", args[index], (col,)))
            hook.record_tensors(items)

        on_loss.__name__ = "loss hook"
        return on_loss


def _inplace(module: Any) -> bool:
    return bool(getattr(module, "inplace", False))


def _can_queue_callback(torch: Any) -> bool:
    engine = getattr(getattr(torch.autograd, "Variable", None), "_execution_engine", None)
    return engine is not None and hasattr(engine, "queue_callback")
