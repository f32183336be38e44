"""What a PyTorch model's build makes zero, constant, frozen or unused (the manifest's structure).

Some parameters look faulty to the rules although the model is right: a convolution's bias
feeding BatchNorm has a zero gradient (the normalisation subtracts it), an attention key
bias too (softmax ignores a constant added to every logit), a frozen or unused parameter
never moves. ``TorchIntegration`` finds them and hands them to ``Hook.set_structure``:

* at ``register_module``: frozen parameters (``requires_grad`` False), attention key biases
  (a ``Linear`` named ``key``, ``k_proj``, ``k_lin`` or ``to_k`` inside a module whose class
  name says attention: BERT, RoBERTa, DistilBERT, ViT, BART, OPT, CLIP), and
  ``nn.MultiheadAttention.in_proj_bias`` (fused: only its key third, recorded as a slice,
  which no rule leaves out);
* by one traced forward (the first with gradients enabled in training mode): a bias whose
  layer's output feeds only a normalisation that removes it. The trace reads the autograd
  graph: the normalisation's input must be the layer's output node itself, referenced by no
  other node (an output also used by a skip connection has a gradient), and the
  normalisation must subtract a per-channel constant: BatchNorm with batch statistics, and
  after a convolution InstanceNorm, GroupNorm with one channel per group, LayerNorm over
  spatial dimensions only. A ``Linear`` bias before ``LayerNorm`` is not structural: LayerNorm
  removes only its mean across features;
* at the first backward the hook records: trainable parameters that got no gradient.

Limits: functional normalisations (``F.batch_norm``), a reshape or view between the layer
and the normalisation, fused q/k/v projections other than MultiheadAttention's, and models
traced only under ``torch.no_grad`` are not found (the rules then judge those tensors as
before); a parameter that gets gradients only in some backward passes (alternating losses,
mixture-of-experts routing) may be recorded as unused; a key bias is found by its name.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from trainguard.format.documents import (
    ATTENTION_KEY_BIAS,
    ATTENTION_KEY_BIAS_SLICE,
    FROZEN,
    NO_GRADIENT,
    NORM_FED_BIAS,
)

#: the last name component of an attention key projection
KEY_NAMES = frozenset({"key", "k_proj", "k_lin", "to_k"})
#: autograd nodes visited at most by the trace (a large model's graph has ~10 per layer)
MAX_NODES = 500_000


def static_structure(torch: Any, top: Any, names: Mapping[int, str]) -> dict[str, str]:
    """Frozen parameters and attention key biases (``names``: id(parameter) -> saved name)."""
    nn = torch.nn
    out: dict[str, str] = {}
    for param in top.parameters():
        name = names.get(id(param))
        if name is not None and not param.requires_grad:
            out[name] = FROZEN
    for sub in top.modules():
        if isinstance(sub, nn.MultiheadAttention) and sub.in_proj_bias is not None:
            _put(out, names, sub.in_proj_bias, ATTENTION_KEY_BIAS_SLICE)
        for child_name, child in sub.named_children():
            if (
                isinstance(child, nn.Linear)
                and child.bias is not None
                and child_name in KEY_NAMES
                and _is_attention(sub)
            ):
                _put(out, names, child.bias, ATTENTION_KEY_BIAS)
    return out


def unused(params: Iterable[tuple[str, Any]]) -> dict[str, str]:
    """Trainable parameters without a gradient after a backward (``(name, parameter)``)."""
    return {name: NO_GRADIENT for name, p in params if p.requires_grad and p.grad is None}


class NormTrace:
    """One traced forward: which biased layers feed only a bias-removing normalisation."""

    def __init__(self, torch: Any, top: Any, names: Mapping[int, str]) -> None:
        self.torch = torch
        self.names = names
        nn = torch.nn
        self._layers: list[Any] = []
        self._norms: list[Any] = []
        for sub in top.modules():
            biased = getattr(sub, "bias", None) is not None
            if biased and isinstance(sub, nn.Linear | nn.modules.conv._ConvNd):
                self._layers.append(sub)
            elif isinstance(sub, _NORMS(nn)):
                self._norms.append(sub)
        #: id(output node) -> (node, layer, output ndim); (norm, input node, input ndim)
        self._outputs: dict[int, tuple[Any, Any, int]] = {}
        self._fed: list[tuple[Any, Any, int]] = []
        self._handles: list[Any] = []

    @property
    def worthwhile(self) -> bool:
        return bool(self._layers and self._norms)

    def install(self) -> None:
        for layer in self._layers:
            self._handles.append(layer.register_forward_hook(self._on_layer))
        for norm in self._norms:
            self._handles.append(norm.register_forward_hook(self._on_norm))

    def remove(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def _on_layer(self, module: Any, args: Any, output: Any) -> None:
        node = getattr(output, "grad_fn", None)
        if node is not None:
            self._outputs[id(node)] = (node, module, output.dim())

    def _on_norm(self, module: Any, args: Any, output: Any) -> None:
        first: Any = args[0] if isinstance(args, tuple) and args else None
        node = getattr(first, "grad_fn", None)
        if node is not None and _removes_bias_mode(self.torch, module):
            self._fed.append((module, node, first.dim()))

    def finish(self, output: Any) -> dict[str, str]:
        """The structure found, from the graph of the traced forward's ``output``."""
        self.remove()
        candidates = {id(node) for _, node, _ in self._fed if id(node) in self._outputs}
        if not candidates:
            return {}
        parents = _parent_counts(_roots(self.torch, output), candidates)
        out: dict[str, str] = {}
        for norm, node, ndim in self._fed:
            entry = self._outputs.get(id(node))
            if entry is None or parents.get(id(node), 0) != 1:
                continue  # not a biased layer's own output, or used elsewhere too
            _, layer, _ = entry
            if _removes_bias(self.torch, norm, layer, ndim):
                _put(out, self.names, layer.bias, NORM_FED_BIAS)
        return out


def _NORMS(nn: Any) -> tuple[type, ...]:
    return (
        nn.modules.batchnorm._BatchNorm,
        nn.modules.instancenorm._InstanceNorm,
        nn.GroupNorm,
        nn.LayerNorm,
    )


def _removes_bias_mode(torch: Any, norm: Any) -> bool:
    """Whether the normalisation uses the statistics of its input (not running averages)."""
    nn = torch.nn
    if isinstance(norm, nn.modules.batchnorm._BatchNorm | nn.modules.instancenorm._InstanceNorm):
        return bool(norm.training or getattr(norm, "running_mean", None) is None)
    return True


def _removes_bias(torch: Any, norm: Any, layer: Any, ndim: int) -> bool:
    """Whether ``norm`` subtracts every constant ``layer``'s bias adds (per channel)."""
    nn = torch.nn
    conv = isinstance(layer, nn.modules.conv._ConvNd)
    if isinstance(norm, nn.modules.batchnorm._BatchNorm):
        # per channel (dim 1) over every other dim: a conv's bias is per channel; a Linear's is
        # per feature, which is dim 1 only for a 2-D (batch, features) output
        return conv or ndim == 2
    if not conv:
        return False  # the other normalisations reduce over a Linear's feature dim
    if isinstance(norm, nn.modules.instancenorm._InstanceNorm):
        return True
    if isinstance(norm, nn.GroupNorm):
        return bool(norm.num_groups == norm.num_channels)
    if isinstance(norm, nn.LayerNorm):
        return len(norm.normalized_shape) <= ndim - 2  # spatial dims only, not the channels
    return False


def _is_attention(module: Any) -> bool:
    cls = type(module).__name__.lower()
    return "attention" in cls or "attn" in cls


def _put(out: dict[str, str], names: Mapping[int, str], param: Any, kind: str) -> None:
    name = names.get(id(param))
    if name is not None:
        out.setdefault(name, kind)


def _roots(torch: Any, value: Any, depth: int = 0) -> Iterator[Any]:
    """The autograd nodes of every tensor in a forward's output (tuples, lists, dicts)."""
    if depth > 4:
        return
    if isinstance(value, torch.Tensor):
        if value.grad_fn is not None:
            yield value.grad_fn
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _roots(torch, item, depth + 1)
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _roots(torch, item, depth + 1)


def _parent_counts(roots: Iterable[Any], candidates: set[int]) -> dict[int, int]:
    """How many edges of the graph point at each candidate node."""
    counts: dict[int, int] = {}
    seen: set[int] = set()
    stack = list(roots)
    keep = list(stack)  # the nodes stay alive while their ids are compared
    seen.update(id(n) for n in stack)
    while stack and len(seen) < MAX_NODES:
        node = stack.pop()
        for child, _ in getattr(node, "next_functions", ()):
            if child is None:
                continue
            key = id(child)
            if key in candidates:
                counts[key] = counts.get(key, 0) + 1
            if key not in seen:
                seen.add(key)
                keep.append(child)
                stack.append(child)
    if stack:
        return {}  # too large to know: record nothing rather than guess
    return counts
