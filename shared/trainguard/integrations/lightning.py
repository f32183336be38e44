"""Lightning (the ``lightning`` package): ``TrainguardCallback``, a ``lightning.pytorch.Callback``.

::

    import lightning as L
    from trainguard.integrations.lightning import TrainguardCallback

    trainer = L.Trainer(max_epochs=10, callbacks=[TrainguardCallback(out_dir="s3://bucket/jobs/run-7",
                                                                     rules=RULES)])
    trainer.fit(model, train_loader, val_loader)

What is recorded, when, and how the stop works: ``trainguard.integrations.lightning_base``.
For the standalone ``pytorch_lightning`` package use
``trainguard.integrations.pytorch_lightning.TrainguardCallback``.
"""

from __future__ import annotations

from lightning.pytorch import Callback

from trainguard.integrations.lightning_base import LightningRecorder


class TrainguardCallback(LightningRecorder, Callback):  # type: ignore[misc]
    __doc__ = LightningRecorder.__doc__


__all__ = ["TrainguardCallback"]
