"""Train one run through the public ``trainguard.Hook`` and store it in the corpus cache.

Each run is trained once. The hook records every statistic it can compute: losses every
step, tensor statistics (weights, biases, gradients with percentiles, ReLU outputs with
per-unit activity, activation inputs with per-unit band fractions, model inputs with value
counts, labels and predictions with their values) every ``TRAIN_RECORD_INTERVAL`` TRAIN
steps and every EVAL step, so a replay can emulate any save configuration whose intervals
are multiples of that (``corpus.emulate``). What the hook wrote is converted to one
compact file per run (``steps.jsonl.gz``, a step document per line) next to:

* ``run.json``: the spec (cause: fault, grade, parameters, onset; twin) and the outcome
  (final validation loss and accuracy, divergence); written last: its presence means done;
* ``trace.json.gz``: the bench's own per-step signals (loss, gradient and update norms,
  dead/saturated unit shares, input statistics, label shares, padding share) for dating
  the symptom's onset by effect size, and the evaluations;
* ``updates.json.gz``: ``||W_s - W_prev||`` at every save of every emulated interval (the
  hook's ``update_l2`` is relative to its previous save, so it depends on the interval).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import trainguard
from torch import nn
from trainguard.hook.config import CollectionKeys as K
from trainguard.hook.config import SaveConfig, SaveConfigMode, default_collection
from trainguard.modes import ModeKeys

from bench.accuracy import plan
from bench.accuracy.corpus import read_job_folder, write_json, write_json_gz
from bench.accuracy.pipeline import Pipeline, Switches, pad_share
from bench.accuracy.plan import RunSpec, TrainConfig
from bench.accuracy.tasks import cosine, make_dataset, make_model, weight_layers

#: intervals whose ``update_l2`` is simulated (the recorded interval's comes from the hook)
SIMULATED_INTERVALS = (20, 50, 100, 500)

#: tensor collections recorded (with their built-in reductions, plus update norms)
RECORDED_COLLECTIONS = plan.RECORDED_COLLECTIONS


def full_statistics() -> dict[str, Any]:
    """``statistics="all"`` where the hook has that option (it computes every statistic,
    not only what the configured rules read); older hooks compute all for explicit
    collections anyway."""
    import inspect

    return {"statistics": "all"} if "statistics" in inspect.signature(trainguard.Hook).parameters else {}


def recording_collections() -> list[Any]:
    cfg = SaveConfig(
        mode_save_configs={
            ModeKeys.TRAIN: SaveConfigMode(save_interval=plan.TRAIN_RECORD_INTERVAL),
            ModeKeys.EVAL: SaveConfigMode(save_interval=1),
        }
    )
    out = []
    for name in RECORDED_COLLECTIONS:
        col = default_collection(name)
        col.save_config = cfg
        if name in (K.WEIGHTS, K.BIASES):
            col.update_norm = True
        out.append(col)
    return out


# ------------------------------------------------------------------------------ optimiser
def make_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    params = list(model.parameters())
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "momentum":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "rmsprop":
        return torch.optim.RMSprop(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")


def schedule_factor(cfg: TrainConfig, step: int, total: int) -> float:
    if cfg.schedule == "cosine":
        return 0.05 + 0.95 * cosine(step, total)
    if cfg.schedule == "step":
        return 1.0 if step < total // 2 else (0.3 if step < 3 * total // 4 else 0.1)
    return 1.0


# ------------------------------------------------------------------------------ faults
def _first_layer(model: nn.Module) -> nn.Module:
    return weight_layers(model)[0]


def _last_layer(model: nn.Module) -> nn.Module:
    return weight_layers(model)[-1]


def _middle_modules(family: str, model: Any) -> list[nn.Module]:
    return {
        "tabular": lambda: [model.net[2]],
        "cnn": lambda: [model.features[3]],
        "resnet": lambda: [model.block1.conv2],
        "lstm": lambda: [model.lstm],
        "transformer": lambda: [model.layers[0].ff1],
    }[family]()


def _weight_modules(model: nn.Module) -> list[nn.Module]:
    return [*weight_layers(model), *[m for m in model.modules() if isinstance(m, nn.LSTM)]]


def _pre_relu(family: str, model: Any) -> tuple[nn.Module, torch.Tensor]:
    """The module whose output feeds the first ReLU, and the bias that shifts it."""
    if family == "tabular":
        return model.net[0], model.net[0].bias
    if family == "cnn":
        return model.features[0], model.features[0].bias
    if family == "resnet":
        return model.stem[1], model.stem[1].bias
    return model.layers[0].ff1, model.layers[0].ff1.bias


def _vanish_module(family: str, model: Any) -> nn.Module:
    return {
        "tabular": lambda: model.net[1],
        "cnn": lambda: model.features[2],
        "resnet": lambda: model.stem,
        "lstm": lambda: model.embedding,
        "transformer": lambda: model.embedding,
    }[family]()


def _decayed(model: nn.Module) -> list[torch.Tensor]:
    return [p for n, p in model.named_parameters() if p.dim() >= 2]


def apply_onset(
    spec: RunSpec,
    model: Any,
    sw: Switches,
    pipe: Pipeline,
    xb: torch.Tensor,
    optimizer: torch.optim.Optimizer,
) -> None:
    """Switch the fault on (once, at the onset step, before that step's batch is drawn)."""
    kind, p, fam = spec.fault, spec.params, spec.family
    if kind in ("lr_spike", "stall"):
        sw.lr_scale = float(p["factor"])
    elif kind == "corrupt_batch":
        sw.corrupt, sw.corrupt_every = str(p["kind"]), int(p["every"])
    elif kind == "freeze":
        if p["layers"] == "first":
            targets = list(_first_layer(model).parameters())
        elif p["layers"] == "all_but_last":
            last = {id(q) for q in _last_layer(model).parameters()}
            targets = [q for q in model.parameters() if id(q) not in last]
        else:
            targets = list(model.parameters())
        for q in targets:
            q.requires_grad_(False)
            q.grad = None
    elif kind == "zero_layer":
        mods = _middle_modules(fam, model) if p["layers"] == "middle" else _weight_modules(model)
        with torch.no_grad():
            for m in mods:
                for q in m.parameters():
                    q.mul_(float(p["scale"]))
                    # a checkpoint load replaces the optimizer's state too (Adam's moments
                    # would otherwise push the zeros straight back)
                    optimizer.state.pop(q, None)
    elif kind == "vanish":
        eps = float(p["eps"])
        _vanish_module(fam, model).register_forward_hook(lambda _m, _i, out: out * eps)
    elif kind == "dead_relu":
        _kill_units(spec, model, xb, float(p["share"]))
    elif kind == "saturate":
        with torch.no_grad():
            for m in model.net:
                if isinstance(m, nn.Linear) and m is not model.net[-1]:
                    m.weight.mul_(float(p["factor"]))
    elif kind == "overfit":
        n = len(pipe.data.train.y)
        sw.subset = np.sort(pipe.fault_rng.choice(n, int(p["subset"]), replace=False))
    elif kind == "shuffle_labels":
        sw.shuffle_share = float(p["share"])
    elif kind == "oscillate":
        sw.batch, sw.lr_scale = int(p["batch"]), float(p["factor"])
    elif kind == "unnormalized":
        sw.unnormalized = str(p["level"])
    elif kind == "imbalance":
        weights = np.full(4, 1.0 / float(p["ratio"]))
        weights[0] = 1.0
        sw.class_weights = weights
    elif kind == "confusion":
        sw.confuse_share = float(p["share"])
    elif kind == "truncate":
        sw.truncate = int(p["keep"])
    elif kind == "overpadded":
        sw.pad_to = int(p["pad_to"])
    elif kind == "weight_decay":
        sw.weight_keep = float(p["keep"])
    elif kind == "poor_init":
        pass  # applied before training (``init_fault``)
    else:
        raise ValueError(f"unknown fault {kind!r}")


def init_fault(spec: RunSpec, model: nn.Module) -> None:
    if spec.fault == "poor_init":
        with torch.no_grad():
            for m in _weight_modules(model):
                for name, q in m.named_parameters():
                    if "weight" in name:
                        q.mul_(float(spec.params["gain"]))


def _kill_units(spec: RunSpec, model: Any, xb: torch.Tensor, share: float) -> None:
    """Shift the bias of a share of the first ReLU layer's units below their largest input."""
    shadow = make_model(spec.family, spec.config.get("act", "relu"))
    shadow.load_state_dict(model.state_dict())
    shadow.eval()
    module, bias = _pre_relu(spec.family, model)
    shadow_module, _ = _pre_relu(spec.family, shadow)
    seen: list[torch.Tensor] = []
    handle = shadow_module.register_forward_hook(lambda _m, _i, out: seen.append(out.detach()))
    with torch.no_grad():
        shadow(xb)
    handle.remove()
    pre = seen[0]
    units = bias.shape[0]
    dims = [d for d in range(pre.dim()) if d != (1 if pre.dim() == 4 else pre.dim() - 1)]
    top = pre.amax(dim=dims)
    spread = pre.std(dim=dims)
    gen = torch.Generator().manual_seed(spec.seed + 17)
    chosen = torch.randperm(units, generator=gen)[: round(share * units)]
    with torch.no_grad():
        bias[chosen] -= top[chosen] + 3.0 * spread[chosen] + 0.5
    del module


# ------------------------------------------------------------------------------ signals
class Probe:
    """The bench's own forward hooks: dead-unit and saturation shares of training batches."""

    def __init__(self, model: nn.Module) -> None:
        self.on = False
        self.dead: list[float] = []
        self.sat: list[float] = []
        for m in model.modules():
            if isinstance(m, nn.ReLU):
                m.register_forward_hook(self._relu)
            elif isinstance(m, nn.Tanh):
                m.register_forward_hook(self._tanh)

    def _relu(self, _m: nn.Module, _i: Any, out: torch.Tensor) -> None:
        if self.on:
            active = out.detach() > 0
            dims = [d for d in range(active.dim()) if d != (1 if active.dim() == 4 else active.dim() - 1)]
            self.dead.append(float((~active.any(dim=dims)).float().mean()))

    def _tanh(self, _m: nn.Module, inputs: Any, _out: torch.Tensor) -> None:
        if self.on:
            self.sat.append(float((inputs[0].detach().abs() > 4.0).float().mean()))


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


class UpdateSimulator:
    """``||W - W at the previous save||`` for each emulated interval, as the hook would compute."""

    def __init__(self, model: nn.Module) -> None:
        self.params = [(n, p) for n, p in model.named_parameters()]
        self.prev: dict[int, dict[str, torch.Tensor]] = {i: {} for i in SIMULATED_INTERVALS}
        self.out: dict[str, dict[str, dict[str, float]]] = {str(i): {} for i in SIMULATED_INTERVALS}

    def observe(self, mode: str, mode_step: int) -> None:
        for interval in SIMULATED_INTERVALS:
            if mode_step % interval:
                continue
            prev = self.prev[interval]
            row: dict[str, float] = {}
            for name, p in self.params:
                cur = p.detach()
                key = f"{mode}:{name}"  # as the hook: between two saves of the same mode
                if key in prev:
                    value = float(torch.linalg.vector_norm((cur - prev[key]).double()))
                    row[name] = value if math.isfinite(value) else 1e308
                    prev[key].copy_(cur)
                else:
                    prev[key] = cur.clone()
            if row:
                self.out[str(interval)][f"{mode}:{mode_step}"] = row


# ------------------------------------------------------------------------------ one run
def train_torch(spec: RunSpec, job_dir: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Train; returns (outcome, trace, simulated updates)."""
    torch.manual_seed(spec.seed)
    torch.set_num_threads(1)
    cfg = TrainConfig(**spec.config)
    data = make_dataset(spec.family, spec.seed)
    pipe = Pipeline(data, spec.seed, cfg.batch)
    model = make_model(spec.family, cfg.act)
    init_fault(spec, model)
    optimizer = make_optimizer(cfg, model)
    criterion = nn.CrossEntropyLoss()
    hook = trainguard.Hook(
        job_dir,
        include_collections=[*K.SCALAR_COLLECTIONS, *RECORDED_COLLECTIONS],
        collections=recording_collections(),
        stop_check_interval_s=0,
        **full_statistics(),
    )
    hook.register_module(model)
    hook.register_loss(criterion)
    probe = Probe(model)
    updates = UpdateSimulator(model)
    mode_steps = {"TRAIN": 0, "EVAL": 0}
    current = {"mode": "TRAIN"}

    def on_forward(_m: nn.Module, _args: Any) -> None:
        updates.observe(current["mode"], mode_steps[current["mode"]])
        mode_steps[current["mode"]] += 1

    model.register_forward_pre_hook(on_forward)
    sw = Switches()
    first = _first_layer(model)
    sig: dict[str, list[float | None]] = {
        k: []
        for k in (
            "loss",
            "lr",
            "nonfinite",
            "gnorm",
            "gfirst",
            "upd",
            "wvar",
            "wzero",
            "xmean",
            "xstd",
            "pad",
            "ymax",
            "yconf",
            "dead",
            "sat",
        )
    }
    evals: list[dict[str, Any]] = []
    steps = plan.STEPS
    for t in range(steps):
        if spec.fault is not None and spec.onset == t and spec.fault != "poor_init":
            apply_onset(spec, model, sw, pipe, pipe.transform(data.train.x[:64], sw), optimizer)
        lr = cfg.lr * schedule_factor(cfg, t, steps) * sw.lr_scale
        for group in optimizer.param_groups:
            group["lr"] = lr
        xb, yb = pipe.train_batch(sw)
        probe.on, probe.dead, probe.sat = True, [], []
        out = model(xb)
        probe.on = False
        loss = criterion(out, yb)
        optimizer.zero_grad()
        if loss.requires_grad:  # every layer frozen: nothing to differentiate
            loss.backward()
        params = [q for q in model.parameters()]
        before = [q.detach().clone() for q in params]
        grads = [q.grad for q in params if q.grad is not None]
        gnorm = (
            float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
            if grads
            else 0.0
        )
        fw = first.weight
        gfirst = float(fw.grad.abs().mean()) if fw.grad is not None else 0.0
        optimizer.step()
        if sw.weight_keep != 1.0:
            with torch.no_grad():
                for q in _decayed(model):
                    q.mul_(sw.weight_keep)
        with torch.no_grad():
            num = sum(
                float(torch.linalg.vector_norm(q.detach() - b) ** 2)
                for q, b in zip(params, before, strict=True)
            )
            den = sum(float(torch.linalg.vector_norm(b) ** 2) for b in before)
            mats = [q.detach() for q in _decayed(model)]
            wvar = float(np.mean([float(m.var()) for m in mats]))
            wzero = float(max(float((m == 0).float().mean()) for m in mats))
        lv = float(loss.detach())
        sig["loss"].append(_finite(lv))
        sig["lr"].append(lr)
        sig["nonfinite"].append(float(not math.isfinite(lv) or not math.isfinite(gnorm)))
        sig["gnorm"].append(_finite(gnorm))
        sig["gfirst"].append(_finite(gfirst))
        sig["upd"].append(_finite(math.sqrt(num / den)) if den > 0 else None)
        sig["wvar"].append(_finite(wvar))
        sig["wzero"].append(wzero)
        if xb.is_floating_point():
            sig["xmean"].append(_finite(float(xb.mean())))
            sig["xstd"].append(_finite(float(xb.std())))
            sig["pad"].append(None)
        else:
            sig["xmean"].append(None)
            sig["xstd"].append(None)
            sig["pad"].append(pad_share(xb))
        counts = np.bincount(yb.numpy(), minlength=4) / len(yb)
        sig["ymax"].append(float(counts.max()))
        sig["yconf"].append(float(counts[1]))
        sig["dead"].append(float(np.mean(probe.dead)) if probe.dead else None)
        sig["sat"].append(float(np.mean(probe.sat)) if probe.sat else None)
        if (t + 1) % plan.EVAL_EVERY == 0 or t == steps - 1:
            evals.append(_evaluate(model, criterion, hook, pipe, sw, t, current))
    hook.close()
    final = evals[-1]
    diverged = any(v == 1.0 for v in sig["nonfinite"]) or final["val_loss"] is None
    outcome = {
        "val_loss": final["val_loss"],
        "val_acc": final["val_acc"],
        "diverged": bool(diverged),
        "train_steps": steps,
    }
    trace = {"signals": sig, "evals": evals}
    return outcome, trace, updates.out


def _evaluate(
    model: nn.Module,
    criterion: nn.Module,
    hook: Any,
    pipe: Pipeline,
    sw: Switches,
    t: int,
    current: dict[str, str],
) -> dict[str, Any]:
    hook.set_mode(ModeKeys.EVAL)
    current["mode"] = "EVAL"
    model.eval()
    total, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for xb, yb in pipe.val_batches(sw, plan.EVAL_BATCHES):
            out = model(xb)
            loss = criterion(out, yb)
            total += float(loss) * len(yb)
            correct += int((out.argmax(1) == yb).sum())
            n += len(yb)
    model.train()
    hook.set_mode(ModeKeys.TRAIN)
    current["mode"] = "TRAIN"
    val_loss = total / n
    return {"step": t, "val_loss": _finite(val_loss), "val_acc": correct / n}


def record(spec: RunSpec, cache: Path) -> Path:
    """Train ``spec`` (unless already stored) and store it under ``cache``; returns its folder."""
    run_dir = cache / "runs" / spec.run_id
    if (run_dir / "run.json").is_file():
        return run_dir
    scratch = cache / "scratch" / spec.run_id
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    scratch.mkdir(parents=True)
    logging.getLogger("trainguard").setLevel(logging.ERROR)
    started = time.process_time()
    wall = time.perf_counter()
    job_dir = scratch / spec.run_id
    if spec.family == "xgboost":
        from bench.accuracy.xgb import train_xgboost

        outcome, trace, updates = train_xgboost(spec, job_dir)
    else:
        outcome, trace, updates = train_torch(spec, job_dir)
    cpu = time.process_time() - started
    stored = read_job_folder(job_dir)
    tmp = run_dir.with_name(run_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with gzip.open(tmp / "steps.jsonl.gz", "wt", compresslevel=6) as fh:
        for step in stored.steps:
            fh.write(json.dumps(step, separators=(",", ":")) + "\n")
    write_json(tmp / "manifest.json", stored.manifest)
    write_json(tmp / "end.json", stored.end)
    write_json_gz(tmp / "trace.json.gz", trace)
    write_json_gz(tmp / "updates.json.gz", updates)
    write_json(
        tmp / "run.json",
        {
            "spec": spec.to_json(),
            "outcome": outcome,
            "recorded": {
                "format": stored.format,
                "train_record_interval": 1 if spec.family == "xgboost" else plan.TRAIN_RECORD_INTERVAL,
                "objects": stored.objects,
                "steps": len(stored.steps),
                "warnings": stored.warnings,
                "cpu_s": round(cpu, 2),
                "wall_s": round(time.perf_counter() - wall, 2),
                "trainguard": trainguard.__version__,
                "torch": str(torch.__version__),
            },
        },
    )
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(run_dir)
    tmp.rename(run_dir)
    shutil.rmtree(scratch, ignore_errors=True)
    return run_dir
