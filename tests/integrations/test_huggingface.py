"""The Hugging Face Trainer callback, on a 2-layer GPT-2 (hidden size 32) built from a config."""

from __future__ import annotations

import logging
import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="the [huggingface] extra is not installed")

import trainguard  # noqa: E402
from conftest import wait_for, write_stop_signal  # noqa: E402
from trainguard import Collection, SaveConfig  # noqa: E402
from trainguard.integrations.huggingface import TrainguardCallback  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

VOCAB, SEQ = 64, 16


class Tokens(torch.utils.data.Dataset):
    """Synthetic token sequences with structure (each token follows the previous one)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = (torch.randint(0, VOCAB, (n, 1), generator=g) + torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, n_positions=SEQ, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config)


def make_trainer(tmp_path, callbacks, **overrides) -> Trainer:
    options = dict(
        output_dir=str(tmp_path / "out"),
        max_steps=12,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=6,
        learning_rate=0.1,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=6,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    options.update(overrides)
    return Trainer(
        model=tiny_gpt2(),
        args=TrainingArguments(**options),
        train_dataset=Tokens(256, 0),
        eval_dataset=Tokens(20, 1),  # 20 = 6 + 6 + 6 + 2: the last batch is smaller
        callbacks=callbacks,
    )


def logged(trainer: Trainer, key: str) -> dict[int, float]:
    return {h["step"]: h[key] for h in trainer.state.log_history if key in h}


def test_losses_metrics_and_steps_match_the_trainer_under_gradient_accumulation(tmp_path, job_dir):
    callback = TrainguardCallback(out_dir=job_dir, stop_check_interval_s=0)
    trainer = make_trainer(tmp_path, [callback], gradient_accumulation_steps=3)
    trainer.train()
    trial = trainguard.create_trial(job_dir)
    # one trainguard step per optimizer update, numbered as the Trainer logs them
    assert trial.steps(mode="TRAIN") == list(range(1, 13))
    train_loss = trial.tensor("loss").values(mode="TRAIN")
    trainer_loss = logged(trainer, "loss")
    assert train_loss.keys() == trainer_loss.keys()
    for step, value in trainer_loss.items():
        assert train_loss[step] == pytest.approx(value, rel=1e-5), step
    # evaluation after steps 6 and 12, in EVAL mode, equal to eval_loss (batch-size weighted)
    eval_loss = trial.tensor("loss").values(mode="EVAL")
    assert eval_loss.keys() == {6, 12}
    for step, value in logged(trainer, "eval_loss").items():
        assert eval_loss[step] == pytest.approx(value, rel=1e-5)
    train_metrics = trial.scalars(mode="TRAIN")
    assert set(train_metrics["learning_rate"]) == set(range(1, 13))
    assert train_metrics["grad_norm"][3] == pytest.approx(logged(trainer, "grad_norm")[3], rel=1e-5)
    eval_metrics = trial.scalars(mode="EVAL")
    assert set(eval_metrics["eval_runtime"]) == {6, 12}
    # the Trainer's loss entries are not recorded as metrics (the computed losses are)
    assert "eval_loss" not in eval_metrics and "train_loss" not in train_metrics
    assert trial.end_markers()[0].dropped_objects == 0


def test_a_nan_loss_is_recorded_though_the_trainer_logs_hide_it(tmp_path, job_dir):
    callback = TrainguardCallback(out_dir=job_dir, stop_check_interval_s=0)
    trainer = make_trainer(tmp_path, [callback], learning_rate=1e3)  # absurd, and no clipping
    trainer.train()
    recorded = trainguard.create_trial(job_dir).tensor("loss").values(mode="TRAIN")
    nan_steps = [s for s, v in recorded.items() if math.isnan(v)]
    assert nan_steps, recorded
    trainer_loss = logged(trainer, "loss")
    # logging_nan_inf_filter (the default) replaced the NaN in what the Trainer logs
    assert all(math.isfinite(trainer_loss[s]) for s in nan_steps)
    eval_recorded = trainguard.create_trial(job_dir).tensor("loss").values(mode="EVAL")
    assert math.isnan(eval_recorded[12])


class PreStep(TrainerCallback):
    """Notes what the model holds at the optimizer step, to compare with what was recorded."""

    def __init__(self) -> None:
        self.weight_norm: dict[int, float] = {}
        self.grad_norm: dict[int, float] = {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        param = model.transformer.h[0].mlp.c_fc.weight
        self.weight_norm[state.global_step + 1] = float(param.detach().norm())
        self.grad_norm[state.global_step + 1] = float(param.grad.norm())


def test_weights_and_gradients_are_those_of_the_optimizer_step(tmp_path, job_dir):
    every_4 = SaveConfig(save_interval=4)
    callback = TrainguardCallback(
        out_dir=job_dir,
        stop_check_interval_s=0,
        collections=[Collection("weights", every_4), Collection("gradients", every_4)],
    )
    probe = PreStep()
    trainer = make_trainer(tmp_path, [probe, callback], gradient_accumulation_steps=2)
    trainer.train()
    trial = trainguard.create_trial(job_dir)
    name = "transformer.h.0.mlp.c_fc.weight"
    weight = trial.tensor(name)
    grad = trial.tensor(f"gradient/{name}")
    assert weight.steps(mode="TRAIN") == grad.steps(mode="TRAIN") == [4, 8, 12]
    for step in (4, 8, 12):
        assert weight.stats(step, mode="TRAIN").l2 == pytest.approx(probe.weight_norm[step], rel=1e-4)
        assert grad.stats(step, mode="TRAIN").l2 == pytest.approx(probe.grad_norm[step], rel=1e-4)
    # biases follow their own (default) schedule, every 50 steps: none in 12 steps; their
    # gradients are gradients (every 4 steps)
    assert not [n for n in trial.tensor_names(collection="biases")]
    assert "gradient/transformer.h.0.mlp.c_fc.bias" in trial.tensor_names(collection="gradients")


class StopAt(TrainerCallback):
    """Plays the service: writes the stop signal at one step and waits until the hook saw it."""

    def __init__(self, step: int, job_dir, callback: TrainguardCallback) -> None:
        self.step, self.job_dir, self.callback = step, job_dir, callback

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            write_stop_signal(self.job_dir, rule="ExplodingTensor", reason="NaN loss")
            assert wait_for(lambda: self.callback.hook.should_stop)


def test_the_stop_signal_ends_training_after_a_checkpoint(tmp_path, job_dir, caplog):
    callback = TrainguardCallback(out_dir=job_dir, stop_check_interval_s=0.02)
    trainer = make_trainer(
        tmp_path,
        [StopAt(5, job_dir, callback), callback],
        max_steps=40,
        save_strategy="steps",
        save_steps=1000,
    )
    with caplog.at_level(logging.WARNING, logger="trainguard.integrations"):
        trainer.train()
    assert trainer.state.global_step == 5
    assert callback.stopped_at_step == 5
    assert "ExplodingTensor" in callback.stop_reason
    assert (tmp_path / "out" / "checkpoint-5").is_dir()  # saved before stopping
    assert any("stopping training at step 5" in r.getMessage() for r in caplog.records)
    trial = trainguard.create_trial(job_dir)
    assert trial.end_markers()[0].stopped and trial.steps(mode="TRAIN")[-1] == 5


def test_a_hook_that_raises_on_stop_still_stops_the_trainer_way(tmp_path, job_dir):
    hook = trainguard.Hook(job_dir, stop_check_interval_s=0.02, raise_on_stop=True)
    callback = TrainguardCallback(hook)
    trainer = make_trainer(tmp_path, [StopAt(3, job_dir, callback), callback], max_steps=40)
    trainer.train()  # nothing raised into the Trainer
    assert trainer.state.global_step == 3
    assert not hook.disabled
    hook.close()  # the caller's hook stays open for the caller (and is closed by them)
    assert trainguard.create_trial(job_dir).steps(mode="TRAIN")[-1] == 3


def test_custom_compute_loss_falls_back_to_the_logged_loss_or_record_loss(tmp_path, caplog):
    micro: dict[int, list[float]] = {}

    class OwnLoss(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs.pop("labels")
            outputs = model(**inputs)
            logits = outputs.logits[:, :-1].reshape(-1, VOCAB)
            loss = torch.nn.functional.cross_entropy(logits, labels[:, 1:].reshape(-1))
            micro.setdefault(self.state.global_step + 1, []).append(float(loss.detach()))
            if self.record:
                callback.record_loss(loss)
            return (loss, outputs) if return_outputs else loss

    for record in (False, True):
        job = tmp_path / f"own-{record}"
        micro.clear()
        callback = TrainguardCallback(out_dir=job, stop_check_interval_s=0)
        base = make_trainer(
            tmp_path, [callback], max_steps=4, gradient_accumulation_steps=2, eval_strategy="no"
        )
        trainer = OwnLoss(
            model=base.model, args=base.args, train_dataset=base.train_dataset, callbacks=[callback]
        )
        trainer.record = record
        with caplog.at_level(logging.WARNING, logger="trainguard.integrations"):
            trainer.train()
        warned = any("output carries no loss" in r.getMessage() for r in caplog.records)
        assert warned is not record
        caplog.clear()
        recorded = trainguard.create_trial(job).tensor("loss").values(mode="TRAIN")
        assert sorted(recorded) == [1, 2, 3, 4]
        for step, value in logged(trainer, "loss").items():
            if record:  # the mean of the step's micro-batch losses, as computed
                assert recorded[step] == pytest.approx(sum(micro[step]) / 2, rel=1e-5)
            else:  # what the Trainer logged (here twice the loss: this compute_loss ignores
                # num_items_in_batch, so the Trainer does not divide by the accumulation steps)
                assert recorded[step] == pytest.approx(value, rel=1e-5)


def test_an_internal_error_switches_the_callback_off_and_training_goes_on(
    tmp_path, job_dir, caplog, monkeypatch
):
    callback = TrainguardCallback(out_dir=job_dir, stop_check_interval_s=0)

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(callback.capture, "begin_step", broken)
    trainer = make_trainer(tmp_path, [callback], max_steps=5)
    with caplog.at_level(logging.ERROR, logger="trainguard.integrations"):
        trainer.train()
    assert trainer.state.global_step == 5
    assert callback.disabled
    message = "internal error in the Hugging Face Trainer callback"
    errors = [r for r in caplog.records if message in r.getMessage()]
    assert len(errors) == 1 and errors[0].exc_info
    assert callback.adapter.closed  # the hook it created was closed: its end marker is written
    assert 0 in trainguard.create_trial(job_dir).end_markers()


def test_bad_arguments_fail_at_construction(tmp_path):
    with pytest.raises(TypeError, match=r"invalid keyword arguments for trainguard\.Hook"):
        TrainguardCallback(out_dir=tmp_path, no_such_option=1)
    with trainguard.Hook(tmp_path / "j", stop_check_interval_s=0) as hook:
        with pytest.raises(TypeError, match="not both"):
            TrainguardCallback(hook, rules=None)
    with pytest.raises(TypeError, match=r"must be a trainguard\.Hook"):
        TrainguardCallback("runs/job")
