"""A Hugging Face ``Trainer`` run with trainguard's callback: a 2-layer GPT-2 on synthetic tokens.

    trainguard local -- python examples/huggingface_train.py                 # a healthy run
    trainguard local -- python examples/huggingface_train.py --fault lr      # an absurd learning rate
    python examples/huggingface_train.py --out s3://my-bucket/jobs/gpt2-demo

The model is built from a config (nothing is downloaded). With ``--fault lr`` the learning
rate is absurd (SGD at 1000) and there is no gradient clipping: the loss turns to NaN within
a few steps. The Trainer's own log hides it (``logging_nan_inf_filter`` replaces a NaN loss
in what it logs); the callback records the loss as the model computed it, ExplodingTensor
fires, and its StopTraining action ends the run through ``control.should_training_stop``,
after a checkpoint.

``pip install "trainguard[huggingface]"``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from trainguard.integrations.huggingface import TrainguardCallback
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

VOCAB, SEQ = 64, 32

RULES = [
    {
        "RuleConfigurationName": "ExplodingTensor",
        "RuleParameters": {"rule_to_invoke": "ExplodingTensor"},
        "Actions": ["Email", "SMS", "StopTraining"],
    },
    {"RuleConfigurationName": "Overfit", "RuleParameters": {"rule_to_invoke": "Overfit"}},
]


class Tokens(torch.utils.data.Dataset):
    """Token sequences a small model can learn: each token follows the previous one."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = (torch.randint(0, VOCAB, (n, 1), generator=g) + torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


class Pace(TrainerCallback):
    """Sleeps a little after each step, so the timeline of `trainguard local` is readable."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=os.environ.get("TRAINGUARD_OUT_DIR", "runs/gpt2-demo"))
    parser.add_argument("--fault", choices=("none", "lr"), default="none")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pace", type=float, default=0.02, help="seconds of sleep per step")
    parser.add_argument("--checkpoints", default="runs/gpt2-demo-checkpoints")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, n_positions=SEQ, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    trainguard_callback = TrainguardCallback(out_dir=args.out, rules=RULES, stop_check_interval_s=1.0)
    training = TrainingArguments(
        output_dir=args.checkpoints,
        max_steps=args.steps,
        per_device_train_batch_size=8,
        learning_rate=1e3 if args.fault == "lr" else 0.1,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=0.0,  # no gradient clipping
        logging_steps=1 if args.fault == "lr" else 10,  # every step: see what the log shows
        eval_strategy="steps",
        eval_steps=50,
        save_strategy="steps",
        save_steps=100,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Tokens(4096, 0),
        eval_dataset=Tokens(64, 1),
        callbacks=[trainguard_callback, Pace(args.pace)],
    )
    print(f"training a 2-layer GPT-2 (fault={args.fault}); trainguard writes to {args.out}", flush=True)
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    shown = ", ".join(f"{v:.3g}" for v in logged[-3:])
    if trainguard_callback.stopped_at_step is not None:
        step = trainguard_callback.stopped_at_step
        saved = os.path.join(args.checkpoints, f"checkpoint-{step}")
        print(
            f"trainguard stopped training at step {step} ({trainguard_callback.stop_reason}); "
            f"checkpoint {saved} {'saved' if os.path.isdir(saved) else 'missing'}; "
            f"the Trainer's last logged losses: {shown}",
            flush=True,
        )
    else:
        finite = all(math.isfinite(v) for v in logged)
        print(f"finished {trainer.state.global_step} steps; logged losses {shown} (all finite: {finite})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
