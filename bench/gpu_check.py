"""The GPU path, checked in one short run on a CUDA machine (``bench/gpu_check.sh`` runs it).

    python bench/gpu_check.py --out gpu-results            # on a machine with a CUDA GPU
    python bench/gpu_check.py --device cpu --quick         # a smoke run of the script itself

Four parts, each reported even when another fails:

1. **Statistics on the device**: the same tensors (with NaN, Inf, zeros) saved through the
   public hook from the GPU and from the CPU; every statistic must agree.
2. **Hook overhead on the device**: a CNN trained without a hook, with the default hook and
   with statistics of weights, gradients and ReLU outputs every step; time per step with
   ``torch.cuda.synchronize()`` at the block ends, ratios to no hook (median of
   repetitions, interleaved). ``bench/hook_overhead.py --device cuda`` is the full benchmark
   once it has that option; this is the short version.
3. **NVML monitor**: ``Hook(profiler=0.2)`` during GPU work; the system batches must carry GPU
   samples (utilisation, memory).
4. **The framework callbacks on the device**: Hugging Face (``use_cpu=False``), Lightning
   (``accelerator="gpu"``) and Keras (torch backend) with an absurd learning rate; the
   recorded losses must show the fault, and gradients must have been reduced on the device.

Writes ``results.json`` and ``results.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

FIELDS = ("numel", "mean", "std", "min", "max", "mean_abs", "l1", "l2", "zeros", "nan", "inf")


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def part_statistics(device: str, quick: bool) -> dict[str, Any]:
    import torch
    import trainguard

    g = torch.Generator().manual_seed(0)
    tensors = {
        "dense": torch.randn(512, 512, generator=g),
        "with_nan_inf": torch.randn(1000, generator=g),
        "half": torch.randn(256, 256, generator=g).half(),
        "zeros": torch.zeros(64, 3),
    }
    tensors["with_nan_inf"][::7] = float("nan")
    tensors["with_nan_inf"][::11] = float("inf")
    with tempfile.TemporaryDirectory() as folder:
        for where in ("cpu", device):
            with trainguard.Hook(Path(folder) / where.replace(":", "-"), stop_check_interval_s=0) as hook:
                for name, value in tensors.items():
                    hook.save_tensor(name, value.to(where), collections=["weights"], step=0)
        cpu = trainguard.create_trial(Path(folder) / "cpu")
        dev = trainguard.create_trial(Path(folder) / device.replace(":", "-"))
        mismatches = []
        for name in tensors:
            a, b = cpu.tensor(name).stats(0), dev.tensor(name).stats(0)
            for field in FIELDS:
                x, y = getattr(a, field), getattr(b, field)
                same = (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-3, abs_tol=1e-5)
                if not same:
                    mismatches.append(f"{name}.{field}: cpu {x} vs {device} {y}")
    return {"ok": not mismatches, "tensors": len(tensors), "mismatches": mismatches}


def cnn(device: str, quick: bool) -> tuple[Any, Any, Any, list[Any]]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    width = 16 if quick else 128
    model = nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(2 * width, 10),
    ).to(device)  # fmt: skip
    batch = 8 if quick else 64
    data = [(torch.randn(batch, 3, 32, 32, device=device), torch.randint(0, 10, (batch,), device=device))] * 4
    return model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), data


def part_overhead(device: str, quick: bool) -> dict[str, Any]:
    import trainguard

    configs: dict[str, Callable[[str], Any]] = {
        "none": lambda folder: None,
        "default": lambda folder: trainguard.Hook(folder, stop_check_interval_s=0),
        "stats_every_step": lambda folder: trainguard.Hook(
            folder,
            save_config=trainguard.SaveConfig(save_interval=1),
            include_collections=["losses", "weights", "biases", "gradients", "relu_output"],
            stop_check_interval_s=0,
        ),
    }
    steps, reps = (5, 2) if quick else (100, 5)
    times: dict[str, list[float]] = {name: [] for name in configs}
    for rep in range(reps):
        for name, make in configs.items():
            model, loss_fn, opt, data = cnn(device, quick)
            with tempfile.TemporaryDirectory() as folder:
                hook = make(str(Path(folder) / f"overhead-{name}-{rep}"))
                if hook is not None:
                    hook.register_module(model)
                    hook.register_loss(loss_fn)
                for i in range(steps + 5):
                    if i == 5:
                        sync(device)
                        start = time.perf_counter()
                    x, y = data[i % len(data)]
                    opt.zero_grad()
                    loss_fn(model(x), y).backward()
                    opt.step()
                if hook is not None:
                    hook.close()  # the flush is part of the cost
                sync(device)
                times[name].append((time.perf_counter() - start) / steps)
    base = times["none"]
    return {
        "ok": True,
        "step_ms": {k: statistics.median(v) * 1000 for k, v in times.items()},
        "ratio": {
            k: statistics.median(t / b for t, b in zip(v, base, strict=True)) for k, v in times.items()
        },
        "steps": steps,
        "repetitions": reps,
    }


def part_nvml(device: str, quick: bool) -> dict[str, Any]:
    import trainguard

    model, loss_fn, opt, data = cnn(device, quick)
    with tempfile.TemporaryDirectory() as folder:
        job = Path(folder) / "nvml"
        with trainguard.Hook(job, profiler=0.2, profiler_flush_s=1.0, stop_check_interval_s=0) as hook:
            hook.register_module(model)
            deadline = time.monotonic() + (1.5 if quick else 5.0)
            while time.monotonic() < deadline:
                x, y = data[0]
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
            sync(device)
        samples = gpus = 0
        utilisation: list[float] = []
        for path in sorted(job.glob("system/**/*.json")):
            batch = json.loads(path.read_text())
            for sample in batch.get("samples", []):
                samples += 1
                for gpu in sample.get("gpus") or []:
                    gpus += 1
                    utilisation.append(float(gpu.get("util_percent", 0.0)))
    expect_gpus = device.startswith("cuda")
    return {
        "ok": samples > 0 and (gpus > 0 or not expect_gpus),
        "system_samples": samples,
        "gpu_samples": gpus,
        "max_gpu_util_percent": max(utilisation, default=None),
        "note": "" if gpus or not expect_gpus else "no GPU samples: is nvidia-ml-py (pynvml) installed?",
    }


def _losses(job: Path) -> list[float]:
    import trainguard

    values = trainguard.create_trial(job).tensor("loss").values(mode="TRAIN")
    return [values[s] for s in sorted(values)]


def part_callbacks(device: str, quick: bool) -> dict[str, Any]:
    import torch
    import trainguard

    results: dict[str, Any] = {}
    every = trainguard.SaveConfig(save_interval=2)
    cols = [trainguard.Collection("gradients", every), trainguard.Collection("weights", every)]
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        try:  # Hugging Face
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from trainguard.integrations.huggingface import TrainguardCallback as HFCallback
            from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

            ids = torch.randint(0, 64, (256, 16), generator=torch.Generator().manual_seed(0))
            data = [{"input_ids": row, "labels": row} for row in ids]
            model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=64))
            args = TrainingArguments(
                output_dir=str(root / "hf-out"),
                max_steps=12,
                per_device_train_batch_size=8,
                learning_rate=1e3,
                optim="sgd",
                max_grad_norm=0.0,
                report_to=[],
                save_strategy="no",
                use_cpu=not device.startswith("cuda"),
                disable_tqdm=True,
                logging_steps=1,
            )
            hf_callback = HFCallback(out_dir=root / "hf", collections=cols, stop_check_interval_s=0)
            Trainer(model=model, args=args, train_dataset=data, callbacks=[hf_callback]).train()
            losses = _losses(root / "hf")
            results["huggingface"] = {
                "ok": any(not math.isfinite(v) for v in losses),
                "losses": losses,
                "device": str(next(model.parameters()).device),
            }
        except Exception:
            results["huggingface"] = {"ok": False, "error": traceback.format_exc()[-2000:]}
        try:  # Lightning
            import lightning as L
            from torch import nn
            from torch.nn import functional as F
            from trainguard.integrations.lightning import TrainguardCallback as LCallback

            class Net(L.LightningModule):
                def __init__(self) -> None:
                    super().__init__()
                    self.net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 3))

                def training_step(self, batch: Any, i: int) -> Any:
                    return F.cross_entropy(self.net(batch[0]), batch[1])

                def configure_optimizers(self) -> Any:
                    return torch.optim.SGD(self.parameters(), lr=1e9)

            xs, ys = torch.randn(512, 8), torch.randint(0, 3, (512,))
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=32)
            trainer = L.Trainer(
                max_steps=12,
                accelerator="gpu" if device.startswith("cuda") else "cpu",
                devices=1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                callbacks=[LCallback(out_dir=root / "lightning", collections=cols, stop_check_interval_s=0)],
            )
            trainer.fit(Net(), loader)
            losses = _losses(root / "lightning")
            results["lightning"] = {"ok": any(not math.isfinite(v) for v in losses), "losses": losses}
        except Exception:
            results["lightning"] = {"ok": False, "error": traceback.format_exc()[-2000:]}
        try:  # Keras on the torch backend (torch places it on the GPU when there is one)
            os.environ.setdefault("KERAS_BACKEND", "torch")
            import keras
            from trainguard.integrations.keras import TrainguardCallback as KCallback

            net = keras.Sequential(
                [keras.Input((8,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(3)]
            )
            net.compile(
                optimizer=keras.optimizers.SGD(1e9),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
            x = np.random.default_rng(0).normal(size=(512, 8)).astype("float32") * 100
            y = np.random.default_rng(1).integers(0, 3, 512)
            k_callback = KCallback(out_dir=root / "keras", collections=cols, stop_check_interval_s=0)
            net.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[k_callback])
            losses = _losses(root / "keras")
            grads = trainguard.create_trial(root / "keras").tensor_names(collection="gradients")
            results["keras"] = {
                "ok": any(not math.isfinite(v) for v in losses) and bool(grads),
                "losses": losses,
                "device": str(net.trainable_weights[0].value.device),
            }
        except Exception:
            results["keras"] = {"ok": False, "error": traceback.format_exc()[-2000:]}
    return {"ok": all(r["ok"] for r in results.values()), **results}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run of the script)")
    args = parser.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: nothing to check (run with --device cpu for a smoke run)", file=sys.stderr)
        return 2
    info = {
        "device": args.device,
        "name": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    report: dict[str, Any] = {"machine": info}
    for name, part in (
        ("statistics", part_statistics),
        ("overhead", part_overhead),
        ("nvml", part_nvml),
        ("callbacks", part_callbacks),
    ):
        started = time.monotonic()
        try:
            report[name] = part(args.device, args.quick)
        except Exception:
            report[name] = {"ok": False, "error": traceback.format_exc()[-3000:]}
        report[name]["seconds"] = round(time.monotonic() - started, 1)
        print(f"{name}: {'ok' if report[name]['ok'] else 'FAILED'} ({report[name]['seconds']} s)", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    lines = [f"GPU check on {info['name']} ({info['when']}, torch {info['torch']})", ""]
    overhead = report["overhead"]
    if overhead.get("ok"):
        lines += ["| hook config | step | ratio to no hook |", "|---|---:|---:|"]
        for k, ms in overhead["step_ms"].items():
            lines.append(f"| {k} | {ms:.2f} ms | {overhead['ratio'][k]:.3f} |")
    lines += [""] + [
        f"- {name}: {'ok' if report[name]['ok'] else 'FAILED'}" for name in report if name != "machine"
    ]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(report[n]["ok"] for n in report if n != "machine") else 1


if __name__ == "__main__":
    sys.exit(main())
