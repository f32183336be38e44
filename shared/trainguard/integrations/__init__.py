"""Callbacks for the trainers people use: Hugging Face ``Trainer``, Lightning, Keras 3.

Each callback takes a ``trainguard.Hook`` or the Hook's own keyword arguments and does the
wiring a hand-written loop would do: steps and modes from the framework's loop, losses as
computed, the framework's metrics, weights and gradients at the optimizer step, and the
stop signal through the framework's own way to end training (see docs/integrations.md)::

    from trainguard.integrations.huggingface import TrainguardCallback      # transformers
    from trainguard.integrations.lightning import TrainguardCallback        # lightning
    from trainguard.integrations.pytorch_lightning import TrainguardCallback  # pytorch_lightning
    from trainguard.integrations.keras import TrainguardCallback            # keras >= 3

Importing this package imports no framework; each module imports its own.
"""
