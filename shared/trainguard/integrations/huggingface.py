"""Hugging Face ``Trainer``: ``TrainguardCallback``, a ``transformers.TrainerCallback``.

::

    from trainguard.integrations.huggingface import TrainguardCallback

    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val,
                      callbacks=[TrainguardCallback(out_dir="s3://bucket/jobs/run-7", rules=RULES)])
    trainer.train()

``TrainguardCallback(hook=None, **hook_kwargs)`` takes a ``trainguard.Hook`` or the Hook's
keyword arguments (the hook is then created when the Trainer starts, with the Trainer's
rank and world size, ``raise_on_stop=False``, and closed when training ends).

Steps are the Trainer's ``state.global_step``: the optimizer update that makes it N is
step N (the first update is step 1, as the Trainer logs it), and an evaluation after
step N is recorded at step N in EVAL mode. What is recorded, each when its collection is
due under the hook's save configs:

* ``loss`` (``losses``, TRAIN), every step: the loss **as the model computed it**, read
  from the model's output in a forward hook, not the Trainer's logged ``loss``, which
  ``logging_nan_inf_filter`` (on by default) cleans of NaN and Inf and averages over
  ``logging_steps``. Under gradient accumulation the micro-batches are combined the way the
  Trainer combines them (summed when the model normalised by ``num_items_in_batch``, else
  averaged), so the value equals the Trainer's own loss for that step whenever it is finite.
  A model whose output carries no loss (a ``compute_loss`` override, ``compute_loss_func``,
  label smoothing): call ``callback.record_loss(loss)`` from ``compute_loss``; otherwise the
  logged loss is recorded instead, with a warning saying what that hides.
* ``loss`` (``losses``, EVAL) after each evaluation, the mean of the evaluation batches'
  losses as computed, weighted by batch size like the Trainer's ``eval_loss`` but without
  its NaN filter; ``<prefix>_loss`` for another ``metric_key_prefix`` (several eval sets).
  ``trainer.predict`` with labels: PREDICT mode.
* The Trainer's metrics (``metrics``): the logged ``learning_rate``, ``grad_norm``, ``epoch``...
  in TRAIN mode, ``on_evaluate``'s metrics (``eval_accuracy``, ``eval_runtime``...) in EVAL,
  ``on_predict``'s in PREDICT; loss-named entries are left out (the losses above are the
  computed ones), and so are the end-of-training throughput summary. Recorded on the world
  process zero only: they are already reduced across processes.
* Weights, biases and gradients (``weights``, ``biases``, ``gradients``; every 50 steps by
  default) at ``on_pre_optimizer_step``, ReLU/Tanh/Sigmoid module activations on due steps
  (see ``trainguard.integrations.torch_capture``). Under fp16 with loss scaling
  (``fp16=True``) gradients are not recorded: an overflowing step's infinite gradients are
  expected there (the scaler skips that step) and would read as an exploding tensor.

Stopping: when a rule with the StopTraining action fires, the callback sets
``control.should_training_stop`` at the next step end, and ``control.should_save`` when the
Trainer saves checkpoints by steps (with ``save_strategy="epoch"`` the Trainer saves at the
end of the interrupted epoch), exactly as the Trainer does when it reaches ``max_steps``.
``callback.stopped_at_step`` and ``callback.stop_reason`` say when and why.

Distributed (``accelerate launch``, ``torchrun``, DDP, FSDP): every process records its own
worker (losses of its batches; its shard of a sharded tensor) and the stop decision is
made together: each step end reduces the flag across processes (one 1-element all-reduce
per step when the world size is above 1), so every rank leaves the loop at the same step.

Never breaking training: an internal error is logged once with its traceback and the
callback switches itself off (module hooks removed); the Trainer goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from transformers import TrainerCallback

from trainguard.hook.config import CollectionKeys as K
from trainguard.hook.core import Hook
from trainguard.integrations.adapter import HookAdapter
from trainguard.integrations.common import Guarded, guarded, is_loss_name, metric_value
from trainguard.integrations.torch_capture import PRODUCES, TorchCapture, any_rank, safe
from trainguard.modes import ModeKeys

log = logging.getLogger("trainguard.integrations")

#: log entries that mark an end-of-run summary (``train_runtime``, ``eval_runtime``...)
_SUMMARY_SUFFIX = "_runtime"


class _LossMean:
    """Losses of one step (or one evaluation), kept on their device until the writer reads them."""

    def __init__(self) -> None:
        self.total: Any = None
        self.weight = 0.0
        self.summed = False

    def add(self, value: Any, weight: float = 1.0) -> None:
        term = value * weight if weight != 1.0 else value
        self.total = term if self.total is None else self.total + term
        self.weight += weight

    def value(self) -> Any:
        if self.total is None:
            return None
        return self.total if self.summed else self.total / self.weight

    def reset(self) -> None:
        self.total, self.weight, self.summed = None, 0.0, False


def _model_loss(output: Any, kwargs: Mapping[str, Any]) -> Any:
    """The loss in a model's output: ``output.loss`` / ``output["loss"]``, or the first element
    of a tuple when labels were passed (the Trainer's own convention), as a detached tensor."""
    if isinstance(output, Mapping):
        loss = output.get("loss")
    elif isinstance(output, tuple | list) and output and "labels" in kwargs:
        loss = output[0]
    else:
        loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss.detach().reshape(())
    return None


def _batch_size(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    for key in ("labels", "input_ids", "inputs_embeds", "pixel_values"):
        value = kwargs.get(key)
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return 1


def _metric_prefix(metrics: Mapping[str, Any], default: str) -> str:
    """``metric_key_prefix`` of an evaluation's metrics (``eval``, ``eval_<set>``, ``test``)."""
    for key in metrics:
        if key.endswith(_SUMMARY_SUFFIX):
            return key[: -len(_SUMMARY_SUFFIX)]
    for key in metrics:
        if key.endswith("_loss"):
            return key[: -len("_loss")]
    return default


class TrainguardCallback(Guarded, TrainerCallback):  # type: ignore[misc]
    """Records a Hugging Face ``Trainer`` run for trainguard's rules and obeys their stop.

    Parameters
    ----------
    hook
        A ``trainguard.Hook`` you created (you close it), or None to let the callback create
        one from ``hook_kwargs``.
    close_on_train_end
        Close the hook the callback created when ``train()`` ends (its end marker tells the
        service the job is over). Pass False to record a ``trainer.evaluate()`` after
        training too, then call ``callback.close()``.
    **hook_kwargs
        ``trainguard.Hook`` keyword arguments (``out_dir``, ``rules``, ``save_config``...).
    """

    framework = "Hugging Face Trainer"
    package = "transformers"

    def __init__(
        self, hook: Hook | None = None, *, close_on_train_end: bool = True, **hook_kwargs: Any
    ) -> None:
        Guarded.__init__(self)
        self.adapter = HookAdapter(
            hook, hook_kwargs, framework=self.framework, package=self.package, produces=PRODUCES
        )
        self.close_on_train_end = close_on_train_end
        self.capture = TorchCapture(self.adapter, self._disable)
        #: the step at which the callback asked the Trainer to stop, and why
        self.stopped_at_step: int | None = None
        self.stop_reason: str | None = None
        self._args: Any = None
        self._model: Any = None
        self._handles: list[Any] = []
        self._train = _LossMean()
        self._eval = _LossMean()
        self._eval_mode_set = False
        self._model_loss_seen = False
        self._user_loss = False
        self._gradients = True

    # ------------------------------------------------------------------ public
    @property
    def hook(self) -> Hook | None:
        """The hook (None until the Trainer starts when the callback creates it)."""
        return self.adapter.hook

    def record_loss(self, loss: Any) -> None:
        """Record this micro-batch's training loss yourself (from a ``compute_loss`` override
        whose loss is not in the model's output). Values of one step are averaged."""
        if self.disabled or not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            return
        if not self._user_loss:
            self._user_loss = True
            self._train.reset()  # from now on the user's values replace the model output's
        self._train.add(loss.detach().reshape(()))

    def close(self) -> None:
        """Detach from the model and close the hook if the callback created it."""
        self._detach()
        self.adapter.close()

    # ------------------------------------------------------------------ setting up
    def _setup(self, args: Any, model: Any) -> None:
        self._args = args
        if self.adapter.closed:
            self.adapter.warn_once(
                "closed-train",
                "the hook was closed when the previous train() ended (close_on_train_end=True), so this "
                "run is not recorded; create a new callback for a new run",
            )
            return
        self.adapter.open(rank=int(args.process_index), world_size=int(args.world_size))
        if args.fp16 and self._gradients:
            self._gradients = False
            self.adapter.warn_once(
                "fp16",
                "fp16 training scales the loss: an overflowing step has infinite gradients by design (the "
                "scaler skips it), so gradients are not recorded; losses, weights and metrics are",
            )
        if model is not None and model is not self._model:
            self._detach()
            self._model = model
            self._handles = [
                model.register_forward_pre_hook(safe(self._before_forward, self._disable)),
                model.register_forward_hook(safe(self._on_forward, self._disable), with_kwargs=True),
            ]
            self.capture.attach(model)

    def _detach(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self.capture.detach()
        self._model = None

    def _on_disabled(self) -> None:
        self.close()

    # ------------------------------------------------------------------ the model's forward
    def _before_forward(self, module: Any, args: Any) -> None:
        if module.training and not self.disabled:
            self.capture.new_batch()

    def _on_forward(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if self.disabled:
            return
        loss = _model_loss(output, kwargs)
        if loss is None:
            return
        # the Trainer's own scaling: a loss normalised by the tokens of every device is
        # multiplied back by the number of processes (Trainer.compute_loss)
        targs = self._args
        normalised = kwargs.get("num_items_in_batch") is not None
        if (
            normalised
            and targs is not None
            and getattr(targs, "average_tokens_across_devices", False)
            and int(targs.world_size) > 1
        ):
            loss = loss * int(targs.world_size)
        if module.training:
            if self._user_loss:
                return
            self._model_loss_seen = True
            self._train.summed = normalised  # normalised by the whole step's items: the parts add up
            self._train.add(loss)
        else:
            if not self._eval_mode_set:
                self._eval_mode_set = True
                self.adapter.set_mode(ModeKeys.EVAL)
            self._eval.add(loss, float(_batch_size(args, kwargs)))

    # ------------------------------------------------------------------ Trainer events
    @guarded
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._setup(args, kwargs.get("model"))

    @guarded
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._setup(args, kwargs.get("model"))

    @guarded
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step) + 1
        self._train.reset()
        self.adapter.begin_step(step, ModeKeys.TRAIN)
        self.capture.begin_step(step)

    @guarded
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.adapter.active:
            return
        step = int(state.global_step) + 1
        self.capture.save_parameters(step)
        if self._gradients:
            self.capture.save_gradients(step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._record_step(state)
        # outside the guard: every rank must take part in the reduction, even one whose
        # callback switched itself off, or the others would wait for it forever
        stop = any_rank(self.adapter.should_stop and not self.disabled, args.device, int(args.world_size))
        if stop and not control.should_training_stop:
            self._stop(args, state, control)

    @guarded
    def _record_step(self, state: Any) -> None:
        loss = self._train.value()
        if loss is not None:
            self.adapter.scalar(
                "loss", loss, step=int(state.global_step), mode=ModeKeys.TRAIN, collection=K.LOSSES
            )
        self._train.reset()

    @guarded
    def _stop(self, args: Any, state: Any, control: Any) -> None:
        control.should_training_stop = True
        if str(getattr(args.save_strategy, "value", args.save_strategy)) == "steps":
            control.should_save = True  # as at max_steps: a checkpoint of the step it stops at
        self.stopped_at_step = int(state.global_step)
        self.stop_reason = self.adapter.stop_reason
        if state.is_world_process_zero:
            log.warning(
                "trainguard: stopping training at step %d (%s)%s",
                self.stopped_at_step,
                self.stop_reason,
                "; saving a checkpoint first" if control.should_save else "",
            )

    @guarded
    def on_log(
        self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not logs or not state.is_world_process_zero or not self.adapter.active:
            return
        if any(key.endswith(_SUMMARY_SUFFIX) for key in logs):
            return  # an evaluation's metrics (recorded by on_evaluate) or the run's throughput summary
        step = int(state.global_step)
        if "loss" in logs and not self._model_loss_seen and not self._user_loss:
            self.adapter.warn_once(
                "logged-loss",
                "the model's output carries no loss (a compute_loss override, compute_loss_func or label "
                "smoothing), so the Trainer's logged loss is recorded: logging_nan_inf_filter may have "
                "removed NaN/Inf from it and it is averaged over logging_steps. Call "
                "callback.record_loss(loss) in compute_loss to record the loss as computed",
            )
            value = metric_value(logs["loss"])
            if value is not None:
                self.adapter.scalar("loss", value, step=step, mode=ModeKeys.TRAIN, collection=K.LOSSES)
        for key, raw in logs.items():
            value = metric_value(raw)
            if value is not None and not is_loss_name(key):
                self.adapter.scalar(key, value, step=step, mode=ModeKeys.TRAIN, collection=K.METRICS)

    @guarded
    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self._record_evaluation(state, metrics or {}, ModeKeys.EVAL, "eval")

    @guarded
    def on_predict(
        self, args: Any, state: Any, control: Any, metrics: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self._record_evaluation(state, metrics or {}, ModeKeys.PREDICT, "test")

    def _record_evaluation(
        self, state: Any, metrics: Mapping[str, Any], mode: ModeKeys, default: str
    ) -> None:
        loss = self._eval.value()
        self._eval.reset()
        self._eval_mode_set = False
        if not self.adapter.active:
            self.adapter.warn_once(
                "closed",
                "the hook is closed (close_on_train_end=True closes it when train() ends), so this "
                "evaluation is not recorded; pass close_on_train_end=False and call callback.close()",
            )
            return
        step = int(state.global_step)
        prefix = _metric_prefix(metrics, default)
        name = "loss" if prefix == default else f"{prefix}_loss"
        if loss is None and state.is_world_process_zero:
            logged = metric_value(metrics.get(f"{prefix}_loss"))
            if logged is not None:
                self.adapter.warn_once(
                    f"logged-{prefix}-loss",
                    "the model's output carries no loss in evaluation, so the Trainer's %s_loss is recorded "
                    "(logging_nan_inf_filter may have removed NaN/Inf batches from it)",
                    prefix,
                )
                loss = logged
        if loss is not None:
            self.adapter.scalar(name, loss, step=step, mode=mode, collection=K.LOSSES)
        if state.is_world_process_zero:
            for key, raw in metrics.items():
                value = metric_value(raw)
                if value is not None and not is_loss_name(key):
                    self.adapter.scalar(key, value, step=step, mode=mode, collection=K.METRICS)
        self.adapter.set_mode(ModeKeys.TRAIN)

    @guarded
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.close_on_train_end:
            self.close()


__all__ = ["TrainguardCallback"]
