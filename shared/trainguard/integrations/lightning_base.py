"""What the Lightning callbacks do, for both packages (``lightning`` and ``pytorch_lightning``).

``trainguard.integrations.lightning.TrainguardCallback`` and
``trainguard.integrations.pytorch_lightning.TrainguardCallback`` are this recorder on the
``Callback`` class of their package (the two packages' Trainers accept only their own).
Nothing here imports Lightning.

Steps are ``trainer.global_step``, the number of optimizer steps taken: the update that
makes it N is step N, and a validation run after step N is recorded at step N. Recorded,
each when its collection is due under the hook's save configs:

* ``loss`` (``losses``, TRAIN): the loss ``training_step`` returned, as computed. Under
  automatic optimization Lightning divides it by ``accumulate_grad_batches`` before the
  callbacks see it; that is undone, and a step's micro-batches are averaged. Under manual
  optimization the returned loss (if any) is recorded at the step the batch ended on.
* ``loss`` (``losses``, EVAL) after each validation run: the mean of the losses
  ``validation_step`` returned (a tensor or ``{"loss": ...}``); if it returns none, the
  validation metric whose name contains ``loss`` (``val_loss``), as Lightning reduced it.
  ``trainer.test()``: the same in PREDICT mode (held-out data, kept apart from the
  validation losses the loss rules compare). The sanity check is not recorded.
* Metrics (``metrics``) logged with ``self.log``: those updated during training steps in
  TRAIN mode, at the step they were logged; those updated during a validation run in EVAL
  mode (test: PREDICT); loss-named ones are left out (the losses above are the computed
  ones). On global rank zero only: Lightning reduces them across processes when asked.
* Weights, biases and gradients at ``on_before_optimizer_step`` (after accumulation and
  unscaling, before the update; with several optimizers, each one's parameters at its own
  step), activations of ReLU/Tanh/Sigmoid modules (``trainguard.integrations.torch_capture``).
  Under ``precision="16-mixed"`` gradients are not recorded (an overflowing step's infinite
  gradients are expected there: the scaler skips that step).

Stopping: ``trainer.should_stop = True`` at the end of the step where the service's stop is
seen, decided together by every process (``strategy.reduce_boolean_decision``), so Lightning
ends the epoch there, runs validation if due and its checkpoint callbacks, as it does for
``EarlyStopping``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from trainguard.hook.config import CollectionKeys as K
from trainguard.hook.core import Hook
from trainguard.integrations.adapter import HookAdapter
from trainguard.integrations.common import Guarded, guarded, is_loss_name, metric_value
from trainguard.integrations.torch_capture import PRODUCES, TorchCapture
from trainguard.modes import ModeKeys

log = logging.getLogger("trainguard.integrations")


def step_loss(outputs: Any) -> Any:
    """The loss in a step's output (a tensor, or a mapping's ``"loss"``), detached; else None."""
    loss: Any = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    numel = getattr(loss, "numel", None)
    if loss is None or not callable(numel) or not hasattr(loss, "detach") or numel() != 1:
        return None
    return loss.detach().reshape(())


class _Mean:
    def __init__(self) -> None:
        self.total: Any = None
        self.count = 0

    def add(self, value: Any) -> None:
        self.total = value if self.total is None else self.total + value
        self.count += 1

    def value(self) -> Any:
        return None if self.total is None else self.total / self.count

    def reset(self) -> None:
        self.total, self.count = None, 0


class LightningRecorder(Guarded):
    """Records a Lightning run for trainguard's rules and obeys their stop (see the module doc).

    Parameters
    ----------
    hook
        A ``trainguard.Hook`` you created (you close it), or None to let the callback create
        one from ``hook_kwargs`` at ``setup`` (with the trainer's global rank and world size,
        ``raise_on_stop=False``). Under ``strategy="ddp_spawn"`` pass keyword arguments: the
        callback is copied into each process, a hook is not.
    close_on_train_end
        Close the hook the callback created when ``fit`` ends (its end marker tells the
        service the job is over). Pass False to record a ``trainer.test()`` after ``fit``,
        then call ``callback.close()``.
    **hook_kwargs
        ``trainguard.Hook`` keyword arguments (``out_dir``, ``rules``, ``save_config``...).
    """

    framework = "Lightning"
    package = "lightning"

    def __init__(
        self, hook: Hook | None = None, *, close_on_train_end: bool = True, **hook_kwargs: Any
    ) -> None:
        Guarded.__init__(self)
        self.adapter = HookAdapter(
            hook, hook_kwargs, framework=self.framework, package=self.package, produces=PRODUCES
        )
        self.close_on_train_end = close_on_train_end
        self.capture = TorchCapture(self.adapter, self._disable)
        #: the step at which the callback asked the trainer to stop, and why
        self.stopped_at_step: int | None = None
        self.stop_reason: str | None = None
        self._gradients = True
        self._step: int | None = None
        self._recorded_step = -1
        self._train = _Mean()
        self._eval = _Mean()
        self._eval_mode: ModeKeys | None = None
        self._metrics_before: dict[str, Any] = {}
        self._optimizer_params: dict[int, frozenset[int]] = {}

    # ------------------------------------------------------------------ public
    @property
    def hook(self) -> Hook | None:
        """The hook (None until ``setup`` when the callback creates it)."""
        return self.adapter.hook

    def close(self) -> None:
        """Detach from the model and close the hook if the callback created it."""
        self.capture.detach()
        self.adapter.close()

    def _on_disabled(self) -> None:
        self.close()

    # ------------------------------------------------------------------ set-up
    @guarded
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.adapter.closed:
            return
        self.adapter.open(rank=int(trainer.global_rank), world_size=int(trainer.world_size))
        self.capture.attach(pl_module)
        if str(trainer.precision).startswith("16") and "mixed" in str(trainer.precision) and self._gradients:
            self._gradients = False
            self.adapter.warn_once(
                "fp16",
                "precision=%s scales the loss: an overflowing step has infinite gradients by design (the "
                "scaler skips it), so gradients are not recorded; losses, weights and metrics are",
                trainer.precision,
            )

    # ------------------------------------------------------------------ training
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # unguarded: every rank must agree on which batch ends a step (see on_train_batch_end)
        self._recorded_step = int(trainer.global_step)

    def _begin(self, step: int) -> None:
        if step != self._step:
            self._step = step
            self.adapter.begin_step(step, ModeKeys.TRAIN)
            self.capture.begin_step(step)

    @guarded
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._begin(int(trainer.global_step) + 1)
        self.capture.new_batch()

    @guarded
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if not self.adapter.active:
            return
        step = int(trainer.global_step) + 1
        self._begin(step)
        only = self._optimizer_params.get(id(optimizer))
        if only is None:
            only = frozenset(id(p) for group in optimizer.param_groups for p in group["params"])
            self._optimizer_params[id(optimizer)] = only
        self.capture.save_parameters(step, only)
        if self._gradients:
            self.capture.save_gradients(step, only)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        completed = self._record_batch(trainer, pl_module, outputs)
        if not completed:
            return
        # outside the guard: every rank must take part in the reduction, even one whose
        # callback switched itself off, or the others would wait for it forever
        stop = self.adapter.should_stop and not self.disabled
        if int(trainer.world_size) > 1:
            stop = bool(trainer.strategy.reduce_boolean_decision(stop, all=False))
        if stop and not trainer.should_stop:
            self._stop(trainer)

    def _record_batch(self, trainer: Any, pl_module: Any, outputs: Any) -> bool:
        """Add the batch's loss; at the end of an optimizer step record it. Returns whether a
        step ended here (the same on every rank)."""
        step = int(trainer.global_step)
        completed = step > self._recorded_step
        self._record_losses(trainer, pl_module, outputs, step, completed)
        if completed:
            self._recorded_step = step
        return completed

    @guarded
    def _record_losses(self, trainer: Any, pl_module: Any, outputs: Any, step: int, completed: bool) -> None:
        loss = step_loss(outputs)
        if loss is not None:
            automatic = bool(getattr(pl_module, "automatic_optimization", True))
            self._train.add(loss * int(trainer.accumulate_grad_batches) if automatic else loss)
        if not completed or not self.adapter.active:
            return
        value = self._train.value()
        self._train.reset()
        if value is not None:
            self.adapter.scalar("loss", value, step=step, mode=ModeKeys.TRAIN, collection=K.LOSSES)
        if trainer.is_global_zero:
            self._record_metrics(trainer, step, ModeKeys.TRAIN)

    @guarded
    def _stop(self, trainer: Any) -> None:
        trainer.should_stop = True
        self.stopped_at_step = int(trainer.global_step)
        self.stop_reason = self.adapter.stop_reason
        if trainer.is_global_zero:
            log.warning(
                "trainguard: stopping training at step %d (%s)", self.stopped_at_step, self.stop_reason
            )

    def _record_metrics(self, trainer: Any, step: int, mode: ModeKeys) -> dict[str, Any]:
        """Record the logged metrics updated since the last look; return the loss-named ones."""
        losses: dict[str, Any] = {}
        seen = self._metrics_before
        for key, raw in trainer.callback_metrics.items():
            if seen.get(key) is raw:
                continue
            seen[key] = raw
            value = metric_value(raw)
            if value is None:
                continue
            if is_loss_name(key):
                losses[key] = value
            else:
                self.adapter.scalar(key, value, step=step, mode=mode, collection=K.METRICS)
        return losses

    # ------------------------------------------------------------------ evaluation
    def _eval_start(self, trainer: Any, mode: ModeKeys) -> None:
        if trainer.sanity_checking or not self.adapter.active:
            self._eval_mode = None
            return
        self._eval_mode = mode
        self._eval.reset()
        self._metrics_before = dict(trainer.callback_metrics)
        self.adapter.set_mode(mode)

    def _eval_batch(self, outputs: Any) -> None:
        if self._eval_mode is not None:
            loss = step_loss(outputs)
            if loss is not None:
                self._eval.add(loss)

    def _eval_end(self, trainer: Any) -> None:
        mode, self._eval_mode = self._eval_mode, None
        if mode is None:
            return
        step = int(trainer.global_step)
        loss = self._eval.value()
        self._eval.reset()
        logged: dict[str, Any] = {}
        if trainer.is_global_zero:
            logged = self._record_metrics(trainer, step, mode)
        else:
            self._metrics_before = dict(trainer.callback_metrics)
        if loss is None and logged:
            name = next((k for k in logged if k.startswith("val")), next(iter(logged)))
            loss = logged[name]
        if loss is not None:
            self.adapter.scalar("loss", loss, step=step, mode=mode, collection=K.LOSSES)
        self.adapter.set_mode(ModeKeys.TRAIN)

    @guarded
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._eval_start(trainer, ModeKeys.EVAL)

    @guarded
    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._eval_batch(outputs)

    @guarded
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._eval_end(trainer)

    @guarded
    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        if self.adapter.closed:
            self.adapter.warn_once(
                "closed",
                "the hook is closed (close_on_train_end=True closes it when fit ends), so trainer.test() is "
                "not recorded; pass close_on_train_end=False and call callback.close()",
            )
        self._eval_start(trainer, ModeKeys.PREDICT)

    @guarded
    def on_test_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._eval_batch(outputs)

    @guarded
    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._eval_end(trainer)

    # ------------------------------------------------------------------ the end
    @guarded
    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.close_on_train_end:
            self.close()

    @guarded
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.close()  # flush what was recorded and write the end marker before the error propagates
