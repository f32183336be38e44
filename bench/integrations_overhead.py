"""Overhead of the framework callbacks at their default configuration, as ratios to the same
training without the callback.

    python bench/integrations_overhead.py              # rewrites its section of docs/benchmarks.md
    python bench/integrations_overhead.py --quick      # a smoke run: tiny models, no docs

Method. Three trainings, each in its framework's own loop: a Hugging Face ``Trainer`` on a
GPT-2 built from a config (4 layers, hidden size 128, 64 tokens, batch 8), a Lightning
``Trainer`` and a Keras 3 ``fit`` (torch backend) on the same 8-layer 512-wide ReLU MLP with
batches of 128. Two configurations each: without the callback, and with
``TrainguardCallback(out_dir=<temp folder>)`` and nothing else (the hook's defaults: losses
and metrics every step, weights, biases, gradients and ReLU outputs every 50 steps). Every
run is its own process, so one configuration's background writer never competes with
another's timing; runs are interleaved, in a shuffled order per repetition. A run times
``--steps`` optimizer steps after ``--warmup`` steps, from the end of the last warm-up step
to the end of training, the callback's closing flush included; a repetition's ratio is the
callback run's time over the no-callback run of the same repetition, and the table gives
the median over repetitions (interleaving cancels the drift a VM shows over minutes).

Measure on a quiet machine: on a loaded one the ratios say more about the load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Integration callback overhead"
FRAMEWORKS = ("huggingface", "lightning", "keras")
CONFIGS = ("none", "default")
LABELS = {
    "huggingface": "Hugging Face Trainer, GPT-2 (4 layers, hidden 128)",
    "lightning": "Lightning, ReLU MLP (8 x 512)",
    "keras": "Keras 3 (torch backend), ReLU MLP (8 x 512)",
}


# ----------------------------------------------------------------------------- one run
def run_huggingface(config: str, steps: int, warmup: int, out_dir: str | None, quick: bool) -> float:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    layers, hidden, seq = (2, 32, 16) if quick else (4, 128, 64)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=layers, n_embd=hidden, n_head=4, n_positions=seq, vocab_size=512, bos_token_id=0,
                   eos_token_id=0)
    )  # fmt: skip

    class Tokens(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.x = torch.randint(0, 512, (4096, seq), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": self.x[i], "labels": self.x[i]}

    timer: dict[str, float] = {}

    class Timer(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == warmup:
                timer["start"] = time.perf_counter()

    callbacks: list[Any] = [Timer()]
    if config == "default":
        from trainguard.integrations.huggingface import TrainguardCallback

        callbacks.append(TrainguardCallback(out_dir=out_dir))
    trainer = Trainer(
        model=model,
        args=TrainingArguments(
            output_dir=tempfile.mkdtemp(prefix="tg-bench-hf-"),
            max_steps=warmup + steps,
            per_device_train_batch_size=8,
            learning_rate=1e-3,
            logging_steps=10,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            log_level="error",
        ),
        train_dataset=Tokens(),
        callbacks=callbacks,
    )
    trainer.train()  # the callback closes its hook at the end of training: the flush is timed
    return time.perf_counter() - timer["start"]


def mlp_data(quick: bool) -> tuple[Any, Any, int, int, int]:
    import numpy as np

    width, depth, batch = (64, 2, 32) if quick else (512, 8, 128)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * 8, 256)).astype("float32")
    y = rng.integers(0, 10, batch * 8)
    return x, y, width, depth, batch


def run_lightning(config: str, steps: int, warmup: int, out_dir: str | None, quick: bool) -> float:
    import lightning as L
    import torch
    from torch import nn
    from torch.nn import functional as F

    x, y, width, depth, batch = mlp_data(quick)
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(256, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(*layers)

        def training_step(self, b: Any, i: int) -> Any:
            return F.cross_entropy(self.net(b[0]), b[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    timer: dict[str, float] = {}

    class Timer(L.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == warmup and "start" not in timer:
                timer["start"] = time.perf_counter()

    callbacks: list[Any] = [Timer()]
    if config == "default":
        from trainguard.integrations.lightning import TrainguardCallback

        callbacks.append(TrainguardCallback(out_dir=out_dir))
    data = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    trainer = L.Trainer(
        max_steps=warmup + steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True))
    return time.perf_counter() - timer["start"]


def run_keras(config: str, steps: int, warmup: int, out_dir: str | None, quick: bool) -> float:
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import keras

    x, y, width, depth, batch = mlp_data(quick)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((256,)), *[keras.layers.Dense(width, activation="relu") for _ in range(depth)],
         keras.layers.Dense(10)]
    )  # fmt: skip
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    timer: dict[str, float] = {}

    class Timer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.batches = 0

        def on_train_batch_end(self, b: int, logs: Any = None) -> None:
            self.batches += 1
            if self.batches == warmup:
                timer["start"] = time.perf_counter()
            if self.batches == warmup + steps:
                self.model.stop_training = True

    callbacks: list[Any] = [Timer()]
    if config == "default":
        from trainguard.integrations.keras import TrainguardCallback

        callbacks.append(TrainguardCallback(out_dir=out_dir))
    per_epoch = len(x) // batch
    epochs = -(-(warmup + steps) // per_epoch)
    model.fit(x, y, batch_size=batch, epochs=epochs, callbacks=callbacks, verbose=0)
    return time.perf_counter() - timer["start"]


RUNNERS = {"huggingface": run_huggingface, "lightning": run_lightning, "keras": run_keras}


def worker(framework: str, config: str, steps: int, warmup: int, quick: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="tg-bench-job-") as folder:
        out_dir = os.path.join(folder, f"bench-{framework}") if config != "none" else None
        seconds = RUNNERS[framework](config, steps, warmup, out_dir, quick)
    print(json.dumps({"seconds": seconds, "steps": steps}))


# ----------------------------------------------------------------------------- the driver
def measure(framework: str, config: str, steps: int, warmup: int, quick: bool) -> float:
    command = [sys.executable, __file__, "--worker", framework, config, "--steps", str(steps)]
    command += ["--warmup", str(warmup)] + (["--quick"] if quick else [])
    env = dict(os.environ, KERAS_BACKEND="torch", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT / "shared"))
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{framework}/{config} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["seconds"]) / int(result["steps"])


def available(framework: str) -> bool:
    import importlib.util

    module = {"huggingface": "transformers", "lightning": "lightning", "keras": "keras"}[framework]
    return importlib.util.find_spec(module) is not None


def table(results: dict[str, dict[str, list[float]]], reps: int, steps: int, wall: float, quick: bool) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        f"`python bench/integrations_overhead.py` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {reps} repetitions of {steps} steps, "
        f"whole run {wall:.0f} s, 1-minute load {load:.1f} at the end). Each configuration ran in its own "
        "process, interleaved; ratio: median over repetitions of (callback run / no-callback run of the "
        "same repetition). The callback at its defaults writes to a local folder."
        + (
            " **Quick run: tiny models instead of those named below; a smoke test, not figures.**"
            if quick
            else ""
        ),
        "",
        "| training | step without callback | step with callback | ratio (median) | ratio range |",
        "|---|---:|---:|---:|---:|",
    ]
    for framework, per_config in results.items():
        base, with_cb = per_config["none"], per_config["default"]
        ratios = sorted(c / b for b, c in zip(base, with_cb, strict=True))
        lines.append(
            f"| {LABELS[framework]} | {statistics.median(base) * 1000:.1f} ms "
            f"| {statistics.median(with_cb) * 1000:.1f} ms | {statistics.median(ratios):.3f} "
            f"| {ratios[0]:.3f}-{ratios[-1]:.3f} |"
        )
    return "\n".join(lines)


def write_section(text: str) -> None:
    current = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    block = f"{SECTION}\n\n{text.strip()}\n\n"
    current = (
        pattern.sub(lambda _: block, current)
        if pattern.search(current)
        else current.rstrip() + "\n\n" + block
    )
    DOCS.write_text(current.rstrip() + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--quick", action="store_true", help="tiny models, 2 repetitions of 6 steps, no docs")
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    parser.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.reps, args.steps, args.warmup, args.no_docs = 2, 6, 2, True
    if args.worker:
        worker(args.worker[0], args.worker[1], args.steps, args.warmup, args.quick)
        return
    frameworks = [f for f in args.frameworks.split(",") if f]
    missing = [f for f in frameworks if f not in RUNNERS or not available(f)]
    if missing:
        raise SystemExit(f"not installed or unknown: {', '.join(missing)} (pip install -e '.[dev]')")
    started = time.monotonic()
    results: dict[str, dict[str, list[float]]] = {f: {c: [] for c in CONFIGS} for f in frameworks}
    rng = random.Random(0)
    for rep in range(args.reps):
        order = [(f, c) for f in frameworks for c in CONFIGS]
        rng.shuffle(order)
        for framework, config in order:
            step_s = measure(framework, config, args.steps, args.warmup, args.quick)
            results[framework][config].append(step_s)
            print(
                f"rep {rep + 1}/{args.reps} {framework:12s} {config:8s} {step_s * 1000:8.2f} ms/step",
                flush=True,
            )
    text = table(results, args.reps, args.steps, time.monotonic() - started, args.quick)
    print("\n" + text)
    if not args.no_docs:
        write_section(text)
        print(f"\nwrote the '{SECTION}' section of {DOCS}")


if __name__ == "__main__":
    main()
