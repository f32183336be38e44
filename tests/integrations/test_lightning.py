"""The Lightning callback, on a small ReLU MLP (both the lightning and pytorch_lightning packages)."""

from __future__ import annotations

import logging
import math

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch", reason="the [lightning] extra is not installed")

import trainguard  # noqa: E402
from callback_helpers import wait_for, write_stop_signal  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from trainguard import Collection, SaveConfig  # noqa: E402
from trainguard.integrations.lightning import TrainguardCallback  # noqa: E402
from trainguard.trial import TensorUnavailableForStep  # noqa: E402


def blobs(n: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 8, generator=g) + 2.0 * F.one_hot(y, 8).float()
    return torch.utils.data.TensorDataset(x, y)


class Net(L.LightningModule):
    def __init__(self, lr: float = 0.1, return_val_loss: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
        self.lr = lr
        self.return_val_loss = return_val_loss
        self.train_losses: dict[int, list[float]] = {}
        self.val_losses: dict[int, list[float]] = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        self.train_losses.setdefault(self.trainer.global_step + 1, []).append(float(loss.detach()))
        self.log("train_acc", (logits.argmax(1) == y).float().mean(), on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        if not self.trainer.sanity_checking:
            self.val_losses.setdefault(self.trainer.global_step, []).append(float(loss))
        self.log("val_loss", loss)
        self.log("val_acc", (logits.argmax(1) == y).float().mean())
        return loss if self.return_val_loss else None

    def test_step(self, batch, batch_idx):
        loss = F.cross_entropy(self.net(batch[0]), batch[1])
        self.log("test_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def fit(tmp_path, callbacks, model=None, **overrides):
    options = dict(
        max_steps=8,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        val_check_interval=4,
        check_val_every_n_epoch=None,
        limit_val_batches=3,
        log_every_n_steps=1,
        default_root_dir=str(tmp_path),
    )
    options.update(overrides)
    trainer = L.Trainer(callbacks=callbacks, **options)
    model = model or Net()
    loaders = [torch.utils.data.DataLoader(blobs(n, seed), batch_size=16) for n, seed in ((512, 0), (64, 1))]
    trainer.fit(model, *loaders)
    return trainer, model


def mean(values):
    return sum(values) / len(values)


def test_losses_metrics_weights_gradients_and_activations(tmp_path, job_dir):
    every_2 = SaveConfig(save_interval=2)
    callback = TrainguardCallback(
        out_dir=job_dir,
        stop_check_interval_s=0,
        collections=[Collection(name, every_2) for name in ("weights", "gradients", "relu_output")],
    )
    _, model = fit(tmp_path, [callback], accumulate_grad_batches=2)
    trial = trainguard.create_trial(job_dir)
    assert trial.steps(mode="TRAIN") == list(range(1, 9))
    # the loss training_step computed (Lightning's 1/accumulate scaling undone), averaged per step
    train_loss = trial.tensor("loss").values(mode="TRAIN")
    for step in range(1, 9):
        assert train_loss[step] == pytest.approx(mean(model.train_losses[step]), rel=1e-5)
    # validation every 4 batches, i.e. after steps 2, 4, 6, 8 (not the sanity check): the mean
    # of validation_step's losses, at the step it followed
    eval_loss = trial.tensor("loss").values(mode="EVAL")
    assert eval_loss.keys() == model.val_losses.keys() == {2, 4, 6, 8}
    for step in (2, 4, 6, 8):
        assert eval_loss[step] == pytest.approx(mean(model.val_losses[step]), rel=1e-5)
    assert sorted(trial.scalars(mode="EVAL")["val_acc"]) == [2, 4, 6, 8]
    assert "val_loss" not in trial.scalars(mode="EVAL")
    assert sorted(trial.scalars(mode="TRAIN")["train_acc"]) == list(range(1, 9))
    # tensors of the optimizer step, every 2 steps; the ReLU module's output with its unit activity
    assert trial.tensor("net.0.weight").steps(mode="TRAIN") == [2, 4, 6, 8]
    assert trial.tensor("gradient/net.2.bias").steps(mode="TRAIN") == [2, 4, 6, 8]
    relu = trial.tensor("net.1/relu_output")
    assert relu.steps(mode="TRAIN") == [2, 4, 6, 8]
    assert len(relu.stats(2, mode="TRAIN").unit_active) == 32
    assert trial.end_markers()[0].dropped_objects == 0
    # what a callback captures is statistics, not full tensors; the manifest names the framework
    with pytest.raises(TensorUnavailableForStep, match="only statistics were saved"):
        trial.tensor("net.0.weight").value(2, mode="TRAIN")
    assert "lightning" in {f.name for f in trial.manifest.frameworks}


def test_gradients_match_the_module_at_the_optimizer_step(tmp_path, job_dir):
    seen: dict[int, float] = {}

    class Probe(L.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            seen[trainer.global_step + 1] = float(pl_module.net[0].weight.grad.norm())

    callback = TrainguardCallback(
        out_dir=job_dir,
        stop_check_interval_s=0,
        save_config=SaveConfig(save_interval=1),
        statistics="all",  # the default rules read no gradient norm: ask for every statistic
    )
    fit(tmp_path, [Probe(), callback], max_steps=3, accumulate_grad_batches=3, limit_val_batches=0)
    grad = trainguard.create_trial(job_dir).tensor("gradient/net.0.weight")
    assert grad.steps(mode="TRAIN") == [1, 2, 3]
    for step in (1, 2, 3):
        assert grad.stats(step, mode="TRAIN").l2 == pytest.approx(seen[step], rel=1e-5)


def test_validation_loss_from_the_logged_metric_when_validation_step_returns_none(tmp_path, job_dir):
    callback = TrainguardCallback(out_dir=job_dir, stop_check_interval_s=0)
    _, model = fit(tmp_path, [callback], model=Net(return_val_loss=False))
    eval_loss = trainguard.create_trial(job_dir).tensor("loss").values(mode="EVAL")
    # Lightning's reduction of the logged val_loss: the batch-size weighted mean (equal batches here)
    for step in (4, 8):
        assert eval_loss[step] == pytest.approx(mean(model.val_losses[step]), rel=1e-5)


def test_an_absurd_learning_rate_shows_up_as_a_nan_loss(tmp_path, job_dir):
    callback = TrainguardCallback(out_dir=job_dir, stop_check_interval_s=0)
    fit(tmp_path, [callback], model=Net(lr=1e6), max_steps=30)
    recorded = trainguard.create_trial(job_dir).tensor("loss").values(mode="TRAIN")
    assert any(math.isnan(v) or math.isinf(v) for v in recorded.values())


class StopAt(L.Callback):
    def __init__(self, step, job_dir, callback) -> None:
        self.step, self.job_dir, self.callback = step, job_dir, callback

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            write_stop_signal(self.job_dir, rule="LossNotDecreasing", reason="flat loss")
            assert wait_for(lambda: self.callback.hook.should_stop)


def test_the_stop_signal_sets_should_stop_and_checkpoints_run(tmp_path, job_dir, caplog):
    callback = TrainguardCallback(out_dir=job_dir, stop_check_interval_s=0.02)
    checkpoint = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    with caplog.at_level(logging.WARNING, logger="trainguard.integrations"):
        trainer, _ = fit(
            tmp_path,
            [StopAt(5, job_dir, callback), callback, checkpoint],
            max_steps=100,
            val_check_interval=50,  # the only checkpoint and validation: those of the stop
            enable_checkpointing=True,
        )
    assert trainer.global_step == 5 and callback.stopped_at_step == 5
    assert "LossNotDecreasing" in callback.stop_reason
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["epoch=0-step=5.ckpt"]
    assert any("stopping training at step 5" in r.getMessage() for r in caplog.records)
    trial = trainguard.create_trial(job_dir)
    assert trial.end_markers()[0].stopped
    # Lightning validates when it stops early: recorded at the step it stopped at
    assert 5 in trial.tensor("loss").values(mode="EVAL")


def test_test_runs_are_recorded_in_predict_mode(tmp_path, job_dir):
    callback = TrainguardCallback(out_dir=job_dir, stop_check_interval_s=0, close_on_train_end=False)
    trainer, model = fit(tmp_path, [callback], max_steps=4, limit_val_batches=0)
    trainer.test(model, torch.utils.data.DataLoader(blobs(32, 2), batch_size=16), verbose=False)
    callback.close()
    trial = trainguard.create_trial(job_dir)
    assert sorted(trial.tensor("loss").values(mode="PREDICT")) == [4]
    assert trial.end_markers()[0].last_step == 4


def test_an_internal_error_switches_the_callback_off(tmp_path, job_dir, monkeypatch, caplog):
    callback = TrainguardCallback(out_dir=job_dir, stop_check_interval_s=0)
    monkeypatch.setattr(callback.capture, "save_parameters", lambda *a, **k: 1 / 0)
    with caplog.at_level(logging.ERROR, logger="trainguard.integrations"):
        trainer, _ = fit(tmp_path, [callback], max_steps=6)
    assert trainer.global_step == 6 and callback.disabled
    assert sum("internal error in the Lightning callback" in r.getMessage() for r in caplog.records) == 1


def test_the_pytorch_lightning_package_has_its_own_callback(tmp_path, job_dir):
    pl = pytest.importorskip("pytorch_lightning")
    from trainguard.integrations.pytorch_lightning import TrainguardCallback as PLCallback

    class PLNet(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 3)

        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = PLCallback(out_dir=job_dir, stop_check_interval_s=0)
    assert isinstance(callback, pl.Callback)
    trainer = pl.Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(PLNet(), torch.utils.data.DataLoader(blobs(64, 0), batch_size=16))
    assert sorted(trainguard.create_trial(job_dir).tensor("loss").values(mode="TRAIN")) == [1, 2, 3]
