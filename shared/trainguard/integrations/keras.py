"""Keras 3 (any backend): ``TrainguardCallback``, a ``keras.callbacks.Callback``.

::

    from trainguard.integrations.keras import TrainguardCallback

    model.fit(x, y, validation_data=(x_val, y_val), epochs=10,
              callbacks=[TrainguardCallback(out_dir="s3://bucket/jobs/run-7", rules=RULES)])

Steps are optimizer updates, numbered as ``model.optimizer.iterations`` counts them: the
update that makes it N is step N (a ``fit`` that resumes a trained model continues its
numbering), and an evaluation after step N is recorded at step N. Recorded, each when its
collection is due under the hook's save configs:

* ``loss`` (``losses``, TRAIN), every step: the batch's loss as computed. Keras reports
  (``logs["loss"]``) the running mean of the epoch so far; the callback reads the loss
  tracker's sums instead (the change of ``total``/``count`` over the batch), which is the
  batch's own loss, weighted as Keras weights it. Once a loss is NaN or infinite, Keras's
  running sum stays so until the epoch ends: the first bad step is recorded as it is, the
  following steps of that epoch as NaN. With ``steps_per_execution`` > 1 one callback call
  covers several steps: their mean is recorded at the last.
* ``loss`` (``losses``, EVAL) after each evaluation (``validation_data`` in ``fit``, or
  ``model.evaluate``): the evaluation's loss as Keras computed it (no NaN filter).
* Metrics (``metrics``): at each epoch end the compiled metrics (``accuracy``...) in TRAIN
  mode; after each evaluation its metrics in EVAL mode; loss-named entries are left out
  (the losses above are the computed ones).
* Weights and biases (``trainable_weights``, by their ``path``, ``sequential/dense/kernel``;
  ``biases`` for names ending in ``bias``) at the start of a due step, the values the step
  uses; gradients (``gradient/<path>``) where the backend keeps them after the step: on the
  torch backend (``variable.value.grad``). JAX and TensorFlow compute gradients inside the
  compiled train step and keep none, so there gradients are not recorded (said once).
  Statistics are computed on the device on torch; other backends copy due tensors to the
  host first.

Stopping: when a rule with the StopTraining action fires, ``model.stop_training = True`` at
the end of that batch: Keras ends the epoch there, runs validation and ``on_epoch_end``
callbacks (``ModelCheckpoint`` with ``save_freq="epoch"`` saves), and ``fit`` returns.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import keras

from trainguard.hook.config import CollectionKeys as K
from trainguard.hook.core import Hook
from trainguard.integrations.adapter import HookAdapter
from trainguard.integrations.common import Guarded, guarded, is_loss_name, metric_value
from trainguard.modes import ModeKeys

log = logging.getLogger("trainguard.integrations")


def _number(value: Any) -> float:
    """A scalar variable's value as a float (through its backend tensor, on any backend)."""
    tensor = getattr(value, "value", value)
    if hasattr(tensor, "detach"):  # torch: no detour through numpy
        return float(tensor.detach().item())
    return float(keras.ops.convert_to_numpy(tensor))


class TrainguardCallback(Guarded, keras.callbacks.Callback):  # type: ignore[misc]
    """Records a Keras ``fit``/``evaluate`` for trainguard's rules and obeys their stop.

    Parameters
    ----------
    hook
        A ``trainguard.Hook`` you created (you close it), or None to let the callback create
        one from ``hook_kwargs`` when training starts (``raise_on_stop=False``).
    close_on_train_end
        Close the hook the callback created when ``fit`` ends (its end marker tells the
        service the job is over). Pass False to record a ``model.evaluate()`` after ``fit``
        too, then call ``callback.close()``.
    **hook_kwargs
        ``trainguard.Hook`` keyword arguments (``out_dir``, ``rules``, ``save_config``...).
    """

    framework = "Keras"
    package = "keras"

    def __init__(
        self, hook: Hook | None = None, *, close_on_train_end: bool = True, **hook_kwargs: Any
    ) -> None:
        Guarded.__init__(self)
        keras.callbacks.Callback.__init__(self)
        self.adapter = HookAdapter(
            hook,
            hook_kwargs,
            framework=self.framework,
            package=self.package,
            produces=(K.LOSSES, K.METRICS, K.WEIGHTS, K.BIASES, K.GRADIENTS, K.DEFAULT),
        )
        self.close_on_train_end = close_on_train_end
        #: the step at which the callback asked Keras to stop, and why
        self.stopped_at_step: int | None = None
        self.stop_reason: str | None = None
        self._step = 0
        self._begin_batch = 0
        self._tracker: Any = None
        self._previous = (0.0, 0.0)
        #: (path, variable, weights-or-biases, matches include_regex, gradient matches it)
        self._variables: list[tuple[str, Any, str, bool, bool]] = []
        self._torch = False

    # ------------------------------------------------------------------ public
    @property
    def hook(self) -> Hook | None:
        """The hook (None until training starts when the callback creates it)."""
        return self.adapter.hook

    def close(self) -> None:
        """Close the hook if the callback created it."""
        self.adapter.close()

    def _on_disabled(self) -> None:
        self.close()

    # ------------------------------------------------------------------ set-up
    def _start(self) -> bool:
        """Open the hook and learn the model (once per fit/evaluate); False once closed."""
        if self.adapter.closed:
            return False
        self.adapter.open()
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        self._step = int(_number(optimizer.iterations)) if optimizer is not None else 0
        self._torch = keras.backend.backend() == "torch"
        self._tracker = next(
            (
                m
                for m in getattr(model, "metrics", ())
                if m.name == "loss" and hasattr(m, "total") and hasattr(m, "count")
            ),
            None,
        )
        regex = [re.compile(r) for r in self.adapter.include_regex]
        self._variables = []
        for variable in model.trainable_weights:
            path = str(getattr(variable, "path", variable.name))
            col = K.BIASES if path.endswith("bias") else K.WEIGHTS
            self._variables.append(
                (
                    path,
                    variable,
                    col,
                    any(p.match(path) for p in regex),
                    any(p.match(f"gradient/{path}") for p in regex),
                )
            )
        if not self._torch and self.adapter.included(K.GRADIENTS):
            self.adapter.warn_once(
                "gradients",
                "the %s backend computes gradients inside its compiled train step and keeps none, so "
                "gradients are not recorded (the torch backend keeps them); losses, weights and metrics are",
                keras.backend.backend(),
            )
        return True

    def _value(self, variable: Any) -> Any:
        """The tensor to reduce: on torch the parameter itself (reduced on its device)."""
        return variable.value if self._torch else keras.ops.convert_to_numpy(variable.value)

    # ------------------------------------------------------------------ training
    @guarded
    def on_train_begin(self, logs: Any = None) -> None:
        if not self._start():
            self.adapter.warn_once("closed", "the hook is closed; this fit is not recorded")

    @guarded
    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._previous = (0.0, 0.0)  # Keras resets its metrics (the loss tracker) as an epoch begins

    @guarded
    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._begin_batch = batch
        if not self.adapter.active:
            return
        step = self._step + 1
        self.adapter.begin_step(step, ModeKeys.TRAIN)
        due = {c for c in (K.WEIGHTS, K.BIASES, K.DEFAULT) if self.adapter.due(c, ModeKeys.TRAIN, step)}
        if not due:
            return
        for path, variable, col, regex, _ in self._variables:
            target = col if col in due else (K.DEFAULT if regex and K.DEFAULT in due else None)
            if target is not None:
                self.adapter.tensor(
                    path, self._value(variable), step=step, mode=ModeKeys.TRAIN, collection=target
                )

    @guarded
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._step += max(1, batch - self._begin_batch + 1)
        step = self._step
        if self.adapter.active:
            loss = self._batch_loss(logs)
            if loss is not None:
                self.adapter.scalar("loss", loss, step=step, mode=ModeKeys.TRAIN, collection=K.LOSSES)
            if self._torch:
                self._save_gradients(step)
        if self.adapter.should_stop and not self.model.stop_training:
            self.model.stop_training = True
            self.stopped_at_step = step
            self.stop_reason = self.adapter.stop_reason
            log.warning("trainguard: stopping training at step %d (%s)", step, self.stop_reason)

    def _batch_loss(self, logs: Any) -> float | None:
        """This batch's loss: the change of the loss tracker's weighted sum over the change of
        its weight (Keras's ``logs["loss"]`` is the epoch's running mean)."""
        tracker = self._tracker
        if tracker is None:
            if logs and "loss" in logs:
                self.adapter.warn_once(
                    "tracker",
                    "the model has no loss tracker (a custom train_step?): recording logs['loss'], "
                    "which Keras averages over the epoch so far",
                )
                value = metric_value(logs["loss"])
                return float(value) if value is not None else None
            return None
        total, count = _number(tracker.total), _number(tracker.count)
        previous_total, previous_count = self._previous
        self._previous = (total, count)
        if count <= previous_count:
            return None
        return (total - previous_total) / (count - previous_count)

    def _save_gradients(self, step: int) -> None:
        grads_due = self.adapter.due(K.GRADIENTS, ModeKeys.TRAIN, step)
        default_due = self.adapter.due(K.DEFAULT, ModeKeys.TRAIN, step)
        if not grads_due and not default_due:
            return
        for path, variable, _, _, regex in self._variables:
            grad = getattr(variable.value, "grad", None)
            if grad is None:
                continue
            col = K.GRADIENTS if grads_due else (K.DEFAULT if regex else None)
            if col is not None:
                self.adapter.tensor(f"gradient/{path}", grad, step=step, mode=ModeKeys.TRAIN, collection=col)

    @guarded
    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if not logs or not self.adapter.active:
            return
        for key, raw in logs.items():
            value = metric_value(raw)
            if value is not None and not key.startswith("val_") and not is_loss_name(key):
                self.adapter.scalar(key, value, step=self._step, mode=ModeKeys.TRAIN, collection=K.METRICS)

    @guarded
    def on_train_end(self, logs: Any = None) -> None:
        if self.close_on_train_end:
            self.close()

    # ------------------------------------------------------------------ evaluation
    @guarded
    def on_test_begin(self, logs: Any = None) -> None:
        if self.adapter.hook is None and not self._start():  # model.evaluate() without fit
            return
        if not self.adapter.active:
            self.adapter.warn_once(
                "closed-eval",
                "the hook is closed (close_on_train_end=True closes it when fit ends), so this evaluation is "
                "not recorded; pass close_on_train_end=False and call callback.close()",
            )
            return
        self.adapter.set_mode(ModeKeys.EVAL)

    @guarded
    def on_test_end(self, logs: Any = None) -> None:
        if not logs or not self.adapter.active:
            return
        for key, raw in logs.items():
            value = metric_value(raw)
            if value is None:
                continue
            if key == "loss":
                self.adapter.scalar("loss", value, step=self._step, mode=ModeKeys.EVAL, collection=K.LOSSES)
            elif not is_loss_name(key):
                self.adapter.scalar(key, value, step=self._step, mode=ModeKeys.EVAL, collection=K.METRICS)
        self.adapter.set_mode(ModeKeys.TRAIN)


__all__ = ["TrainguardCallback"]
