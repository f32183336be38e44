"""PyTorch Lightning (the ``pytorch_lightning`` package): ``TrainguardCallback``.

The same callback as ``trainguard.integrations.lightning.TrainguardCallback``, on
``pytorch_lightning.Callback`` (``pytorch_lightning.Trainer`` accepts only its own
package's callbacks). See ``trainguard.integrations.lightning_base``.
"""

from __future__ import annotations

from pytorch_lightning import Callback

from trainguard.integrations.lightning_base import LightningRecorder


class TrainguardCallback(LightningRecorder, Callback):  # type: ignore[misc]
    __doc__ = LightningRecorder.__doc__
    package = "pytorch_lightning"


__all__ = ["TrainguardCallback"]
