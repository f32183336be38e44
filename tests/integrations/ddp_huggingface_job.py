"""A 2-process DDP Trainer run (gloo, CPU) for test_distributed.py; run by torchrun.

Only rank 0's hook looks for the stop signal (rank 1 checks every 1000 s, i.e. never in
this run): if the ranks did not decide together, rank 1 would train on alone and the run
would hang in the next gradient all-reduce. Each rank writes what it saw to <out>/rank-<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from trainguard.format import layout
from trainguard.format.documents import StopSignal, dump_document
from trainguard.integrations.huggingface import TrainguardCallback
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

STOP_AT = 4


class Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = (torch.randint(0, 64, (512, 1), generator=g) + torch.arange(16)) % 64

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


class StopOnRankZero(TrainerCallback):
    def __init__(self, job: Path, callback: TrainguardCallback) -> None:
        self.job, self.callback = job, callback

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == STOP_AT and args.process_index == 0:
            signal = StopSignal(
                job=self.job.name, rule="ExplodingTensor", reason="NaN", requested_at=time.time()
            )
            path = self.job / layout.STOP_SIGNAL
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(dump_document(signal))
            deadline = time.monotonic() + 60
            while not self.callback.hook.should_stop and time.monotonic() < deadline:
                time.sleep(0.01)


def main() -> int:
    job, out = Path(sys.argv[1]), Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=64, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    callback = TrainguardCallback(out_dir=job, stop_check_interval_s=0.02 if rank == 0 else 1000.0)
    args = TrainingArguments(
        output_dir=str(out / "checkpoints"),
        max_steps=50,
        per_device_train_batch_size=4,
        learning_rate=0.1,
        optim="sgd",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=Tokens(), callbacks=[StopOnRankZero(job, callback), callback]
    )
    trainer.train()
    seen = {
        "rank": rank,
        "world_size": args.world_size,
        "global_step": trainer.state.global_step,
        "stopped_at_step": callback.stopped_at_step,
        "hook_saw_stop": bool(callback.hook.should_stop),
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
