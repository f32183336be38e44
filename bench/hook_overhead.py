"""Hook overhead on CPU PyTorch models, as ratios to the same loop without a hook.

    python bench/hook_overhead.py            # ~3 minutes on 2 cores; rewrites docs/benchmarks.md
    python bench/hook_overhead.py --quick    # a smoke run (CI)

Method. Two models (a deep MLP and a small CNN), four configurations (no hook; the
default hook; statistics of weights, biases, gradients and ReLU outputs every step; full
weights, biases and gradients every 10 steps). Configurations are interleaved in one
process, in a shuffled order per repetition, each block timing ``--steps`` training steps
after a warm-up; a configuration's ratio for one repetition is its block time over the
no-hook block of that repetition, and the table reports the median over repetitions
(interleaving cancels the drift a VM shows over minutes). The hook writes to a local temp
folder, so the background writer (encoding, file writes) competes with training for the
same cores, as it does in a real job. Peak memory is the peak RSS of a separate process
that runs the configuration alone; bytes per step are what the hook wrote, divided by steps.

smdebug, when a venv with it exists (``--smdebug-python``, default /tmp/smdbg/bin/python),
runs the same models and protocol in a subprocess (it cannot share a process: it needs
numpy < 2.3 and protobuf 3.20.3), with its own interleaved no-hook baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Hook overhead"
CONFIGS = ("none", "default", "stats_every_step", "full_every_10")
SMDEBUG_CONFIGS = ("none", "default", "reductions_every_step", "full_every_10")
LABELS = {
    "none": "no hook",
    "default": "default config",
    "stats_every_step": "stats of weights+biases+gradients+relu_output, every step",
    "full_every_10": "full weights+biases+gradients every 10 steps",
    "reductions_every_step": "reductions of weights+biases+gradients+relu_output, every step",
}
TARGETS = {"default": 1.01, "stats_every_step": 1.05, "full_every_10": 1.05}


# ----------------------------------------------------------------------------- models
def make_model(kind: str) -> tuple[Any, Any, Any, list[tuple[Any, Any]]]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    if kind == "mlp":
        width, depth, batch = 512, 8, 128
        layers: list[nn.Module] = [nn.Linear(256, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        layers.append(nn.Linear(width, 10))
        model = nn.Sequential(*layers)
        data = [(torch.randn(batch, 256), torch.randint(0, 10, (batch,))) for _ in range(4)]
    else:
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(64, 10),
        )  # fmt: skip
        data = [(torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))) for _ in range(4)]
    loss = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, loss, opt, data


def train_steps(model: Any, loss_fn: Any, opt: Any, data: list[tuple[Any, Any]], n: int, start: int) -> None:
    for i in range(start, start + n):
        x, y = data[i % len(data)]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()


# ----------------------------------------------------------------------------- hooks
def make_trainguard_hook(config: str, out_dir: str) -> Any:
    import trainguard
    from trainguard import Collection, SaveConfig

    if config == "none":
        return None
    if config == "default":
        return trainguard.Hook(out_dir, stop_check_interval_s=0)
    if config == "stats_every_step":
        return trainguard.Hook(
            out_dir,
            save_config=SaveConfig(save_interval=1),
            include_collections=["losses", "weights", "biases", "gradients", "relu_output"],
            stop_check_interval_s=0,
        )
    if config == "full_every_10":
        every10 = SaveConfig(save_interval=10)
        return trainguard.Hook(
            out_dir,
            include_collections=["losses"],
            collections=[Collection(c, every10, save_full=True) for c in ("weights", "biases", "gradients")],
            stop_check_interval_s=0,
        )
    raise ValueError(config)


def make_smdebug_hook(config: str, out_dir: str) -> Any:
    import smdebug.pytorch as smd

    if config == "none":
        return None
    if config == "default":
        return smd.Hook(out_dir=out_dir)
    if config == "reductions_every_step":
        return smd.Hook(
            out_dir=out_dir,
            save_config=smd.SaveConfig(save_interval=1),
            include_collections=["losses", "weights", "biases", "gradients", "relu_output"],
            reduction_config=smd.ReductionConfig(
                reductions=["mean", "std", "min", "max"], abs_reductions=["mean"], norms=["l1", "l2"]
            ),
        )
    if config == "full_every_10":
        return smd.Hook(
            out_dir=out_dir,
            save_config=smd.SaveConfig(save_interval=10),
            include_collections=["losses", "weights", "biases", "gradients"],
        )
    raise ValueError(config)


class Block:
    """One configuration, alive for the whole run (so its hook's threads compete like in a job)."""

    def __init__(self, model_kind: str, config: str, make_hook: Callable[[str, str], Any], tmp: str) -> None:
        self.model, self.loss, self.opt, self.data = make_model(model_kind)
        self.out_dir = os.path.join(tmp, f"{model_kind}-{config}")
        self.hook = make_hook(config, self.out_dir)
        if self.hook is not None:
            self.hook.register_module(self.model)
            self.hook.register_loss(self.loss)
        self.step = 0

    def run(self, n: int) -> tuple[float, float]:
        """Run n steps; (wall seconds, process CPU seconds: every thread, the hook's included)."""
        wall, cpu = time.perf_counter(), time.process_time()
        train_steps(self.model, self.loss, self.opt, self.data, n, self.step)
        self.step += n
        return time.perf_counter() - wall, time.process_time() - cpu

    def close(self) -> None:
        if self.hook is not None:
            self.hook.close()


def dir_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def measure(
    models: list[str], configs: tuple[str, ...], make_hook: Callable[[str, str], Any], reps: int, steps: int
) -> dict[str, Any]:
    """Interleaved timing: {model: {config: {"ratio", "step_ms", "bytes_per_step"}}}."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    results: dict[str, Any] = {}
    rng = random.Random(0)
    for model_kind in models:
        with tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp:
            blocks = {c: Block(model_kind, c, make_hook, tmp) for c in configs}
            for block in blocks.values():
                block.run(12)  # warm-up: allocator, threads, first objects
            times: dict[str, list[float]] = {c: [] for c in configs}
            cpu: dict[str, list[float]] = {c: [] for c in configs}
            for _ in range(reps):
                order = list(configs)
                rng.shuffle(order)
                for c in order:
                    wall, used = blocks[c].run(steps)
                    times[c].append(wall)
                    cpu[c].append(used)
            for block in blocks.values():
                block.close()
            out: dict[str, Any] = {}
            for c in configs:
                ratios = [t / base for t, base in zip(times[c], times["none"], strict=True)]
                cpu_ratios = [t / base for t, base in zip(cpu[c], cpu["none"], strict=True)]
                written = dir_bytes(blocks[c].out_dir) if blocks[c].hook is not None else 0
                out[c] = {
                    "ratio": statistics.median(ratios),
                    "cpu_ratio": statistics.median(cpu_ratios),
                    "step_ms": 1000 * statistics.median(times[c]) / steps,
                    "bytes_per_step": written / max(1, blocks[c].step),
                }
            results[model_kind] = out
    return results


def peak_rss(model_kind: str, config: str, tool: str, python: str, steps: int) -> float | None:
    """Peak RSS (MiB) of a fresh process running one configuration alone."""
    cmd = [python, __file__, "--rss-worker", model_kind, config, "--tool", tool, "--steps", str(steps)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
        return float(json.loads(proc.stdout.strip().splitlines()[-1])["peak_mib"])
    except Exception:
        return None


def rss_worker(model_kind: str, config: str, tool: str, steps: int) -> None:
    make = make_trainguard_hook if tool == "trainguard" else make_smdebug_hook
    with tempfile.TemporaryDirectory(prefix="tg-bench-rss-") as tmp:
        block = Block(model_kind, config, make, tmp)
        block.run(steps)
        block.close()
    print(json.dumps({"peak_mib": peak_rss_mib()}))


def peak_rss_mib() -> float:
    """This process's peak RSS: VmHWM (ru_maxrss survives exec on Linux, so it would report
    the parent's peak), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ----------------------------------------------------------------------------- report
def table(results: dict[str, Any], rss: dict[tuple[str, str], float | None], configs: tuple[str, ...]) -> str:
    lines = [
        "| model | configuration | step (ms) | wall ratio | CPU ratio | target | peak RSS MiB (Δ) "
        "| bytes / step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model_kind, per in results.items():
        base = rss.get((model_kind, "none"))
        for c in configs:
            r = per[c]
            target = f"≤ {TARGETS[c]:.2f}" if c in TARGETS else ""
            mem = rss.get((model_kind, c))
            mem_text = "n/a" if mem is None else f"{mem:.0f}"
            if mem is not None and base is not None and c != "none":
                mem_text += f" ({mem - base:+.0f})"
            cpu = r.get("cpu_ratio", float("nan"))
            lines.append(
                f"| {model_kind} | {LABELS[c]} | {r['step_ms']:.1f} | {r['ratio']:.3f} | {cpu:.3f} "
                f"| {target} "
                f"| {mem_text} | {r['bytes_per_step']:,.0f} |"
            )
    return "\n".join(lines)


def write_section(text: str) -> None:
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    current = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    block = f"{SECTION}\n\n{text.strip()}\n\n"
    if pattern.search(current):
        current = pattern.sub(lambda _: block, current)
    else:
        current = current.rstrip() + "\n\n" + block
    DOCS.write_text(current.rstrip() + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 2 repetitions of 10 steps, no docs"
    )
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    parser.add_argument("--smdebug-python", default="/tmp/smdbg/bin/python")
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--smdebug-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rss-worker", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS)
    parser.add_argument("--tool", default="trainguard", help=argparse.SUPPRESS)
    args = parser.parse_args()
    models = args.models.split(",")
    if args.quick:
        args.reps, args.steps, args.no_docs = 2, 10, True

    if args.rss_worker:
        rss_worker(args.rss_worker[0], args.rss_worker[1], args.tool, args.steps)
        return
    if args.smdebug_worker:
        import logging

        logging.disable(logging.CRITICAL)
        results = measure(models, SMDEBUG_CONFIGS, make_smdebug_hook, args.reps, args.steps)
        print("SMDEBUG-RESULTS " + json.dumps(results))
        return

    sys.path.insert(0, str(ROOT / "shared"))
    import torch

    started = time.time()
    results = measure(models, CONFIGS, make_trainguard_hook, args.reps, args.steps)
    rss = {(m, c): peak_rss(m, c, "trainguard", sys.executable, args.steps) for m in models for c in CONFIGS}
    report = [
        f"Measured by `bench/hook_overhead.py` (`make bench`) on {os.cpu_count()} CPU cores, "
        f"PyTorch {torch.__version__}, {args.reps} interleaved repetitions of {args.steps} steps "
        "per configuration. "
        "Models: `mlp` = 8 Linear(512) + ReLU layers, batch 128 (2.2 M parameters: weight-heavy, the "
        "worst case for per-tensor reductions); `cnn` = 3 conv layers (32/64/64 channels) on 32x32 "
        "images, batch 32. *wall ratio*: median over repetitions of (block time with the hook) / "
        "(no-hook block time of the same repetition); *CPU ratio*: the same with the process's CPU time "
        "(every thread, so the hook's background writer counts), which is far less sensitive to other "
        "load on the machine. Peak RSS: a fresh process running the configuration alone (Δ: versus no hook).",
        "",
        "### trainguard",
        "",
        table(results, rss, CONFIGS),
    ]
    smd_python = Path(args.smdebug_python)
    if smd_python.exists() and not args.quick:
        cmd = [str(smd_python), __file__, "--smdebug-worker", "--reps", str(args.reps)]
        cmd += ["--steps", str(args.steps), "--models", args.models]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd="/tmp")
            line = next(x for x in proc.stdout.splitlines() if x.startswith("SMDEBUG-RESULTS "))
            smd = json.loads(line.split(" ", 1)[1])
            smd_rss = {
                (m, c): peak_rss(m, c, "smdebug", str(smd_python), args.steps)
                for m in models
                for c in SMDEBUG_CONFIGS
            }
            report += [
                "",
                "### smdebug 1.0.34 (same models and protocol, its own process and no-hook baseline)",
                "",
                table(smd, smd_rss, SMDEBUG_CONFIGS),
            ]
        except Exception as exc:
            report += ["", f"smdebug run failed: {type(exc).__name__}: {str(exc)[:300]}"]
    else:
        report += ["", "smdebug was not measured in this run (no venv at --smdebug-python)."]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    report += [
        "",
        f"Run took {time.time() - started:.0f} s; load average at the end {load:.1f} "
        f"on {os.cpu_count()} cores "
        "(other work on the machine inflates the wall ratios; the CPU ratios are the steadier figure). "
        "What the numbers mean for the defaults: [hook.md](hook.md#collections-and-defaults).",
    ]
    text = "\n".join(report)
    print(text)
    if not args.no_docs:
        write_section(text)


if __name__ == "__main__":
    main()
