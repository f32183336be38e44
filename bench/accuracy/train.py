"""One labelled run: train with the real hook (writing to a local job folder) and the symptom
oracle side by side, then ``replay`` the folder with the rules and keep both verdicts."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import torch
import trainguard
from torch import nn
from torch.func import functional_call
from trainguard.engine.replay import replay
from trainguard.engine.sources import LocalJob
from trainguard.hook.config import Collection, SaveConfig
from trainguard.hook.config import CollectionKeys as K
from trainguard.modes import ModeKeys

from bench.accuracy.oracle import Oracle
from bench.accuracy.tasks import RunConfig, make_data, make_model, make_optimizer

#: the model rules replayed on every run, at their default parameters (17 of the 23 registered:
#: TensorVariance has no default thresholds, NLPSequenceRatio needs token ids,
#: FeatureImportanceOverweight/TreeDepth need XGBoost, SimilarAcrossRuns another job,
#: StalledTrainingRule a clock)
DEFAULT_RULES: tuple[str, ...] = (
    "ExplodingTensor",
    "VanishingGradient",
    "GradientNormRatio",
    "DeadRelu",
    "SaturatedActivation",
    "LossNotDecreasing",
    "Overfit",
    "Overtraining",
    "PoorWeightInitialization",
    "WeightUpdateRatio",
    "AllZero",
    "UnchangedTensor",
    "ClassImbalance",
    "Confusion",
    "CheckInputImages",
    "DataNotNormalized",
    "OscillatingLoss",
)

#: collections saved besides the hook's defaults (losses, metrics, scalars, weights, biases,
#: gradients, relu_output), each at its default interval: what the rules above read
EXTRA_COLLECTIONS: tuple[str, ...] = (
    K.RELU_INPUT,
    K.TANH_INPUT,
    K.SIGMOID_INPUT,
    K.INPUTS,
    K.LABELS,
    K.PREDICTIONS,
)

#: the tensor collections (everything but losses, metrics, scalars): what --tensor-interval sets
TENSOR_COLLECTIONS: tuple[str, ...] = (
    K.WEIGHTS,
    K.BIASES,
    K.GRADIENTS,
    K.RELU_OUTPUT,
    *EXTRA_COLLECTIONS,
)

#: labelled alternatives replayed besides the defaults: (configuration name, rule, parameters)
ALTERNATIVES: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("LossNotDecreasing[mode=TRAIN]", "LossNotDecreasing", {"mode": "TRAIN"}),
    ("CheckInputImages[regex=.*model_input_0]", "CheckInputImages", {"regex": ".*model_input_0"}),
    (
        "AllZero[collection_names=weights,biases,gradients,relu_output]",
        "AllZero",
        {"collection_names": "weights,biases,gradients,relu_output"},
    ),
    (
        "UnchangedTensor[collection_names=weights,biases]",
        "UnchangedTensor",
        {"collection_names": "weights,biases"},
    ),
    ("Overfit[patience=3]", "Overfit", {"patience": "3"}),
    ("OscillatingLoss[mode=EVAL]", "OscillatingLoss", {"mode": "EVAL"}),
)


def rule_configs(names: tuple[str, ...] = DEFAULT_RULES) -> list[dict[str, Any]]:
    return [{"RuleConfigurationName": n, "RuleParameters": {"rule_to_invoke": n}} for n in names]


def alternative_configs() -> list[dict[str, Any]]:
    return [
        {"RuleConfigurationName": label, "RuleParameters": {"rule_to_invoke": rule, **params}}
        for label, rule, params in ALTERNATIVES
    ]


class _Capture:
    """Forward hooks of the oracle's own: the full activation tensors of the training forward."""

    def __init__(self, model: nn.Module) -> None:
        self.on = False
        self.acts: list[tuple[str, str, torch.Tensor]] = []
        for name, module in model.named_modules():
            if isinstance(module, nn.ReLU):
                module.register_forward_hook(self._make(name, ("relu_input", "relu_output")))
            elif isinstance(module, nn.Tanh):
                module.register_forward_hook(self._make(name, ("tanh_input",)))
            elif isinstance(module, nn.Sigmoid):
                module.register_forward_hook(self._make(name, ("sigmoid_input",)))

    def _make(self, name: str, kinds: tuple[str, ...]) -> Any:
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            if not self.on:
                return
            for kind in kinds:
                value = output if kind == "relu_output" else inputs[0]
                self.acts.append((kind, name, value.detach()))

        return hook


def run_one(
    run_id: str, cfg: RunConfig, workdir: Path, keep: bool = False, tensor_interval: int | None = None
) -> dict[str, Any]:
    """Train one configuration, label it with the oracle, replay its job folder."""
    torch.set_num_threads(1)
    started = time.perf_counter()
    data = make_data(cfg)
    model = make_model(cfg, data)
    shadow = make_model(cfg, data)  # un-hooked: the oracle's whole-set losses
    optimizer = make_optimizer(cfg, model)
    criterion = nn.CrossEntropyLoss()
    out_dir = workdir / run_id
    shutil.rmtree(out_dir, ignore_errors=True)
    hook = trainguard.Hook(
        out_dir,
        include_collections=[*K.DEFAULT_INCLUDED, *EXTRA_COLLECTIONS],
        rules=rule_configs(),
        stop_check_interval_s=0,
        collections=[
            Collection(name, SaveConfig(save_interval=tensor_interval)) for name in TENSOR_COLLECTIONS
        ]
        if tensor_interval
        else None,
    )
    hook.register_module(model)
    capture = _Capture(model)
    oracle = Oracle(data.classes)
    gen = torch.Generator().manual_seed(cfg.seed)
    n = len(data.y_train)
    train_global: list[int] = []
    for _ in range(cfg.steps):
        idx = torch.randint(0, n, (min(cfg.batch, n),), generator=gen)
        xb, yb = data.x_train[idx], data.y_train[idx]
        capture.acts = []
        capture.on = True
        out = model(xb)
        capture.on = False
        train_global.append(hook.step)
        loss = criterion(out, yb)
        preds = out.detach().argmax(1)
        hook.save_scalar("loss", loss, collections=[K.LOSSES])
        hook.save_tensor("labels", yb, collections=[K.LABELS])
        hook.save_tensor("predictions", preds, collections=[K.PREDICTIONS])
        optimizer.zero_grad()
        loss.backward()
        named = dict(model.named_parameters())
        grads = {k: p.grad.detach().clone() for k, p in named.items() if p.grad is not None}
        before = {k: p.detach().clone() for k, p in named.items()}
        with torch.no_grad():
            train_loss = float(criterion(functional_call(shadow, before, (data.x_train,)), data.y_train))
            val_loss = float(criterion(functional_call(shadow, before, (data.x_val,)), data.y_val))
        optimizer.step()
        after = {k: p.detach().clone() for k, p in named.items()}
        oracle.observe(
            loss=float(loss.detach()),
            train_loss=train_loss,
            val_loss=val_loss,
            params_before=before,
            params_after=after,
            grads=grads,
            acts=capture.acts,
            inputs=xb,
            labels=yb,
            preds=preds,
        )
        if len(train_global) % cfg.eval_every == 0:
            hook.set_mode(ModeKeys.EVAL)
            with torch.no_grad():
                out = model(data.x_val)
                hook.save_scalar("loss", criterion(out, data.y_val), collections=[K.LOSSES])
                hook.save_tensor("labels", data.y_val, collections=[K.LABELS])
                hook.save_tensor("predictions", out.argmax(1), collections=[K.PREDICTIONS])
            hook.set_mode(ModeKeys.TRAIN)
    hook.close()
    trained = time.perf_counter()
    verdicts = _replay(out_dir, rule_configs(), train_global)
    verdicts.update(_replay(out_dir, alternative_configs(), train_global))
    replayed = time.perf_counter()
    if not keep:
        shutil.rmtree(out_dir, ignore_errors=True)
    return {
        "run": run_id,
        "onsets": oracle.onsets(),
        "verdicts": verdicts,
        "final_train_loss": oracle.train_losses[-1],
        "final_val_loss": oracle.val_losses[-1],
        "seconds_train": trained - started,
        "seconds_replay": replayed - trained,
    }


def _replay(out_dir: Path, configs: list[dict[str, Any]], train_global: list[int]) -> dict[str, Any]:
    result = replay(LocalJob.open(out_dir), rules=configs)
    out: dict[str, Any] = {}
    for row in result.summary():
        step = row["Step"]
        iteration = None
        if step is not None:
            iteration = max((i for i, g in enumerate(train_global) if g <= step), default=0)
        out[row["RuleConfigurationName"]] = {
            "status": row["RuleEvaluationStatus"],
            "step": step,
            "iteration": iteration,
            "details": (row["StatusDetails"] or "")[:400],
        }
    return out
