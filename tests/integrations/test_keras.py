"""The Keras 3 callback, on the torch backend (KERAS_BACKEND=torch: no TensorFlow needed)."""

from __future__ import annotations

import logging
import math
import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras", reason="the [keras] extra is not installed")
pytest.importorskip("torch")
if keras.backend.backend() != "torch":
    pytest.skip("these tests run Keras on the torch backend", allow_module_level=True)

import trainguard  # noqa: E402
from conftest import wait_for, write_stop_signal  # noqa: E402
from trainguard import Collection, SaveConfig  # noqa: E402
from trainguard.integrations.keras import TrainguardCallback  # noqa: E402


def blobs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 8)).astype("float32") + 2.0 * np.eye(8, dtype="float32")[y]
    return x, y


def model(lr: float = 0.05) -> keras.Model:
    keras.utils.set_random_seed(0)
    net = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)]
    )
    net.compile(
        optimizer=keras.optimizers.SGD(lr),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return net


class RunningLoss(keras.callbacks.Callback):
    """What Keras reports per batch: the running mean of the epoch's losses."""

    def __init__(self) -> None:
        super().__init__()
        self.running: list[float] = []
        self.grad_norm: dict[int, float] = {}

    def on_train_batch_end(self, batch, logs=None):
        self.running.append(logs["loss"])
        step = int(self.model.optimizer.iterations.value.item())
        self.grad_norm[step] = float(self.model.trainable_weights[0].value.grad.norm())


def test_batch_losses_metrics_and_tensors(job_dir):
    every_3 = SaveConfig(save_interval=3)
    callback = TrainguardCallback(
        out_dir=job_dir,
        stop_check_interval_s=0,
        collections=[Collection("weights", every_3), Collection("gradients", every_3)],
    )
    probe = RunningLoss()
    x, y = blobs(128, 0)
    history = model().fit(
        x, y, batch_size=32, epochs=2, validation_data=blobs(40, 1), callbacks=[probe, callback], verbose=0
    )
    trial = trainguard.create_trial(job_dir)
    assert trial.steps(mode="TRAIN") == list(range(1, 9))  # 4 batches x 2 epochs
    losses = trial.tensor("loss").values(mode="TRAIN")
    # each recorded loss is the batch's own: their running means per epoch are what Keras logged
    for epoch in range(2):
        batch_losses = [losses[epoch * 4 + i + 1] for i in range(4)]
        running = np.cumsum(batch_losses) / np.arange(1, 5)
        assert running == pytest.approx(probe.running[epoch * 4 : epoch * 4 + 4], rel=1e-5)
    # validation after each epoch (steps 4 and 8), equal to val_loss; metrics per mode
    eval_loss = trial.tensor("loss").values(mode="EVAL")
    assert [eval_loss[4], eval_loss[8]] == pytest.approx(history.history["val_loss"], rel=1e-5)
    assert trial.scalars(mode="TRAIN")["accuracy"][8] == pytest.approx(history.history["accuracy"][1])
    assert trial.scalars(mode="EVAL")["accuracy"][8] == pytest.approx(history.history["val_accuracy"][1])
    # weights at the start of due steps, gradients of the torch backend after them
    assert trial.tensor("sequential/dense/kernel").steps(mode="TRAIN") == [3, 6]
    grad = trial.tensor("gradient/sequential/dense/kernel")
    assert grad.steps(mode="TRAIN") == [3, 6]
    for step in (3, 6):
        assert grad.stats(step, mode="TRAIN").l2 == pytest.approx(probe.grad_norm[step], rel=1e-5)
    assert trial.end_markers()[0].dropped_objects == 0


def test_an_absurd_learning_rate_gives_a_non_finite_batch_loss(job_dir):
    callback = TrainguardCallback(out_dir=job_dir, stop_check_interval_s=0)
    x, y = blobs(256, 0)
    model(lr=1e9).fit(x * 100, y, batch_size=16, epochs=1, callbacks=[callback], verbose=0)
    losses = trainguard.create_trial(job_dir).tensor("loss").values(mode="TRAIN")
    bad = [s for s, v in losses.items() if not math.isfinite(v)]
    assert bad and min(bad) > 1  # the first steps were finite: the fault shows where it happens


class StopAt(keras.callbacks.Callback):
    def __init__(self, step, job_dir, callback) -> None:
        super().__init__()
        self.step, self.job_dir, self.callback, self.batches = step, job_dir, callback, 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        if self.batches == self.step:
            write_stop_signal(self.job_dir, rule="ExplodingTensor", reason="NaN")
            assert wait_for(lambda: self.callback.hook.should_stop)


def test_the_stop_signal_sets_stop_training_and_the_epoch_checkpoint_is_saved(tmp_path, job_dir, caplog):
    callback = TrainguardCallback(out_dir=job_dir, stop_check_interval_s=0.02)
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "ckpt.weights.h5"), save_weights_only=True)
    x, y = blobs(512, 0)
    with caplog.at_level(logging.WARNING, logger="trainguard.integrations"):
        model().fit(
            x,
            y,
            batch_size=16,
            epochs=5,
            callbacks=[StopAt(3, job_dir, callback), callback, checkpoint],
            verbose=0,
        )
    assert callback.stopped_at_step == 3 and "ExplodingTensor" in callback.stop_reason
    assert (tmp_path / "ckpt.weights.h5").is_file()
    trial = trainguard.create_trial(job_dir)
    assert trial.steps(mode="TRAIN")[-1] == 3 and trial.end_markers()[0].stopped
    assert any("stopping training at step 3" in r.getMessage() for r in caplog.records)


def test_evaluate_after_fit_and_alone(job_dir, tmp_path):
    callback = TrainguardCallback(out_dir=job_dir, stop_check_interval_s=0, close_on_train_end=False)
    net = model()
    x, y = blobs(64, 0)
    net.fit(x, y, batch_size=32, epochs=1, callbacks=[callback], verbose=0)
    result = net.evaluate(*blobs(32, 1), callbacks=[callback], verbose=0, return_dict=True)
    callback.close()
    assert trainguard.create_trial(job_dir).tensor("loss").values(mode="EVAL") == {
        2: pytest.approx(result["loss"])
    }
    # an evaluation without training: the model's own step (0 for an untrained model)
    alone = TrainguardCallback(out_dir=tmp_path / "alone", stop_check_interval_s=0)
    model().evaluate(*blobs(32, 1), callbacks=[alone], verbose=0)
    alone.close()
    assert list(trainguard.create_trial(tmp_path / "alone").tensor("loss").values(mode="EVAL")) == [0]


def test_an_internal_error_switches_the_callback_off(job_dir, monkeypatch, caplog):
    callback = TrainguardCallback(out_dir=job_dir, stop_check_interval_s=0)
    monkeypatch.setattr(callback, "_batch_loss", lambda logs: 1 / 0)
    x, y = blobs(64, 0)
    with caplog.at_level(logging.ERROR, logger="trainguard.integrations"):
        history = model().fit(x, y, batch_size=16, epochs=2, callbacks=[callback], verbose=0)
    assert len(history.history["loss"]) == 2 and callback.disabled
    assert sum("internal error in the Keras callback" in r.getMessage() for r in caplog.records) == 1
