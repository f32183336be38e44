"""The values the hook accepts (torch tensors, numpy arrays, JAX arrays, numbers) and their copies.

Torch tensors are recognised without importing torch (the hook never imports a framework
to find out). A scalar on an accelerator is kept as a one-element device tensor and turned
into a float by the background writer, so the training thread never waits for the device;
a full tensor on an accelerator is copied to pinned host memory without blocking, and the
writer waits on the copy's event (``segments.DeviceCopy``).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from trainguard.format import stepfile
from trainguard.hook.segments import DeviceCopy

#: torch dtypes a full tensor can be stored in (the safetensors dtypes; bfloat16 as raw bits)
TORCH_STORABLE = frozenset(
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


def is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def numpy_storable(dtype: np.dtype[Any]) -> bool:
    if dtype.name == "bfloat16":
        return True
    try:
        stepfile.TensorBlob.from_numpy(np.zeros(0, dtype=dtype))
    except stepfile.StepFormatError:
        return False
    return True


def host_copy(value: Any) -> Any:
    """A host copy of a torch tensor; from an accelerator without blocking (the writer waits)."""
    t = value.detach()
    if t.device.type == "cpu":
        return t.clone()
    import torch

    host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.device.type == "cuda")
    host.copy_(t, non_blocking=True)
    if t.device.type == "cuda":
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        return DeviceCopy(host, event)
    return host


def nbytes(copy: Any) -> int:
    """Bytes a host copy holds (0 for None)."""
    if copy is None:
        return 0
    if isinstance(copy, DeviceCopy):
        copy = copy.tensor
    if hasattr(copy, "nbytes"):
        return int(copy.nbytes)
    return int(copy.element_size() * copy.numel())


def to_scalar(value: Any) -> Any:
    """A float, or a one-element device tensor left on its device (no sync on the hot path)."""
    if is_torch(value):
        t = value.detach()
        if t.numel() != 1:
            raise TypeError(f"a scalar must have one element, got shape {tuple(t.shape)}")
        return t if t.device.type != "cpu" else float(t)
    if isinstance(value, np.ndarray | np.generic) and np.size(value) != 1:
        raise TypeError(f"a scalar must have one element, got shape {np.shape(value)}")
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float):
        raise TypeError(f"a scalar must be a number, got {type(value).__name__}")
    return float(value)


def numel(value: Any) -> int:
    """Elements of a tensor, an array or a number (1)."""
    return int(np.prod(getattr(value, "shape", ()) or ()))


def search(regex: str, name: str) -> bool:
    """smdebug's matching of collection regexes: ``re.search``."""
    return re.search(regex, name) is not None
