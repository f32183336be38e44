"""A Lightning run with trainguard's callback: a small ReLU classifier on synthetic blobs.

    trainguard local -- python examples/lightning_train.py                 # a healthy run
    trainguard local -- python examples/lightning_train.py --fault lr      # an absurd learning rate
    trainguard local -- python examples/lightning_train.py --epochs 20     # it overfits
    python examples/lightning_train.py --out s3://my-bucket/jobs/blobs-demo

As shipped (2 epochs, 128 steps) every rule ends NoIssuesFound; a ``--fault lr`` run lasts
10 epochs unless told otherwise, time enough for the stop to arrive. Trained longer, the model
starts to fit the 4,096 training blobs better than the validation ones: its validation loss
is lowest after epoch 5 (0.42) and turns up while the training loss keeps falling. With
``--epochs 10`` the rise (0.45-0.53) is still within 3 noises of the validation loss for
most evaluations and Overfit ends NoIssuesFound; with ``--epochs 20`` it fires at step 704
(epoch 11: the third evaluation in a row above the best by more than its noise, the gap
grown by 0.12), as it should.

With ``--fault lr`` the learning rate jumps to an absurd value (1e9, no gradient clipping) at
step 20, as a schedule gone wrong would: the loss overflows, ExplodingTensor fires, and its
StopTraining action sets ``trainer.should_stop``; Lightning ends the epoch, validates and
its ModelCheckpoint saves.

``pip install "trainguard[lightning]"``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from trainguard.integrations.lightning import TrainguardCallback

RULES = [
    {
        "RuleConfigurationName": "ExplodingTensor",
        "RuleParameters": {"rule_to_invoke": "ExplodingTensor"},
        "Actions": ["Email", "SMS", "StopTraining"],
    },
    {"RuleConfigurationName": "DeadRelu", "RuleParameters": {"rule_to_invoke": "DeadRelu"}},
    {"RuleConfigurationName": "Overfit", "RuleParameters": {"rule_to_invoke": "Overfit"}},
]


def blobs(n: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, 16, generator=g) + 2.0 * F.one_hot(y, 16).float()
    return torch.utils.data.TensorDataset(x, y)


class Classifier(L.LightningModule):
    def __init__(self, fault: str, fault_step: int, pace: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
        self.fault, self.fault_step, self.pace = fault, fault_step, pace

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.fault == "lr" and self.trainer.global_step == self.fault_step:
            for group in self.optimizers().param_groups:  # type: ignore[union-attr]
                group["lr"] = 1e9  # a learning-rate schedule gone wrong
        x, y = batch
        logits = self.net(x)
        self.log("train_acc", (logits.argmax(1) == y).float().mean())
        time.sleep(self.pace)  # so the timeline of `trainguard local` is readable
        return F.cross_entropy(logits, y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.net(x)
        self.log("val_acc", (logits.argmax(1) == y).float().mean())
        return F.cross_entropy(logits, y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=os.environ.get("TRAINGUARD_OUT_DIR", "runs/blobs-demo"))
    parser.add_argument("--fault", choices=("none", "lr"), default="none")
    parser.add_argument("--fault-step", type=int, default=20)
    parser.add_argument(
        "--epochs", type=int, help="default 2 (healthy; 10: Overfit fires), 10 with --fault lr"
    )
    parser.add_argument("--pace", type=float, default=0.02, help="seconds of sleep per step")
    parser.add_argument("--checkpoints", default="runs/blobs-demo-checkpoints")
    args = parser.parse_args(argv)
    if args.epochs is None:  # a fault run lasts long enough for the service's stop to arrive
        args.epochs = 10 if args.fault == "lr" else 2

    torch.manual_seed(0)
    callback = TrainguardCallback(out_dir=args.out, rules=RULES, stop_check_interval_s=1.0)
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(dirpath=args.checkpoints, save_top_k=-1)
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback, checkpoints],
    )
    train = torch.utils.data.DataLoader(blobs(4096, 0), batch_size=64, shuffle=True)
    val = torch.utils.data.DataLoader(blobs(512, 1), batch_size=128)
    print(f"training a ReLU classifier (fault={args.fault}); trainguard writes to {args.out}", flush=True)
    trainer.fit(Classifier(args.fault, args.fault_step, args.pace), train, val)
    if callback.stopped_at_step is not None:
        saved = sorted(os.listdir(args.checkpoints)) if os.path.isdir(args.checkpoints) else []
        print(
            f"trainguard stopped training at step {callback.stopped_at_step} ({callback.stop_reason}); "
            f"checkpoints: {', '.join(saved) or 'none'}",
            flush=True,
        )
    else:
        print(f"finished {trainer.global_step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
