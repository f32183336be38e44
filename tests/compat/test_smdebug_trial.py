"""smdebug's trial calls, made the way smdebug's own PyTorch tests and examples make them.

Each block below is a call pattern from smdebug's ``tests/pytorch`` (test_reduce_config,
test_modes, test_collection, test_simple_write, test_distributed_training) or its analysis
examples, with only the import changed from ``smdebug.trials`` to ``trainguard.trial``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import trainguard
from torch import nn
from trainguard import SaveConfig, modes
from trainguard.format import stepfile
from trainguard.format.documents import (
    ModeRecord,
    SegmentHeader,
    SegmentStep,
    TensorRecord,
    encode_segment,
    segment_tensor_key,
)
from trainguard.format.layout import MANIFEST, segment_key
from trainguard.hook.stats import numpy_stats
from trainguard.trial import (
    StepState,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
    create_trial,
)

pytestmark = pytest.mark.torch


class Net(nn.Module):
    """smdebug's tests/pytorch/utils.py Net, smaller."""

    def __init__(self) -> None:
        super().__init__()
        self.add_module("conv1", nn.Conv2d(1, 4, 5, 1))
        self.add_module("relu0", nn.ReLU())
        self.add_module("conv2", nn.Conv2d(4, 4, 5, 1))
        self.add_module("relu1", nn.ReLU())
        self.add_module("fc1", nn.Linear(4 * 20 * 20, 10))

    def forward(self, x):  # type: ignore[no-untyped-def]
        x = self.relu1(self.conv2(self.relu0(self.conv1(x))))
        return F.log_softmax(self.fc1(x.view(x.shape[0], -1)), dim=1)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("smdebug") / "trial_run")
    hook = trainguard.Hook(
        out_dir=out,
        save_config=SaveConfig(save_steps=[0, 1, 2, 3, 4, 5, 6]),
        include_collections=["weights", "biases", "gradients", "default", "losses"],
        include_regex=["relu0_input_0"],
    )
    torch.manual_seed(0)
    model = Net()
    criterion = nn.NLLLoss()
    hook.register_module(model)
    hook.register_loss(criterion)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    hook.set_mode(modes.TRAIN)
    for _ in range(10):
        data, target = torch.rand(8, 1, 28, 28), torch.randint(0, 10, (8,))
        optimizer.zero_grad()
        loss = criterion(model(data), target)
        loss.backward()
        optimizer.step()
    hook.set_mode(modes.EVAL)
    with torch.no_grad():
        for _ in range(3):
            criterion(model(torch.rand(8, 1, 28, 28)), torch.randint(0, 10, (8,)))
    hook.close()
    return out


def test_reduce_config_calls(out_dir):
    # smdebug tests/pytorch/test_reduce_config.py
    tr = create_trial(out_dir)
    assert tr
    assert len(tr.steps(mode=modes.TRAIN)) == 7
    tname = tr.tensor_names(regex="Net_conv[0-9]+.weight")[0]
    weight_tensor = tr.tensor(tname)
    max_val = weight_tensor.reduction_value(1, abs=False, reduction_name="max")
    assert max_val is not None
    mean_val = weight_tensor.reduction_value(1, abs=False, reduction_name="mean")
    variance_val = weight_tensor.reduction_value(1, abs=False, reduction_name="variance")
    assert variance_val == pytest.approx(weight_tensor.stats(1).std ** 2)
    assert mean_val == pytest.approx(weight_tensor.stats(1).mean)
    tname = tr.tensor_names(regex="relu0_input_0")[0]
    relu_input = tr.tensor(tname)
    assert relu_input.reduction_value(4, abs=False, reduction_name="min") is not None
    abs_max = relu_input.reduction_value(4, abs=True, reduction_name="max")
    stats = relu_input.stats(4)
    assert abs_max == max(abs(stats.min), abs(stats.max))


def test_modes_calls(out_dir):
    # smdebug tests/pytorch/test_modes.py
    trial = create_trial(path=out_dir, name="test output")
    assert trial.name == "test output"
    assert len(trial.modes()) == 2 and modes.TRAIN in trial.modes()
    assert len(trial.steps(mode=modes.TRAIN)) == 7
    assert trial.steps(mode=modes.EVAL) == [0, 1, 2]  # EVAL's own step numbers
    assert len(trial.steps()) == 10  # global steps: 7 TRAIN, 3 EVAL
    eval_loss = trial.tensor("NLLLoss_output_0")
    assert eval_loss.steps(mode=modes.EVAL) == [0, 1, 2]
    first_eval = trial.global_step(modes.EVAL, 0)
    assert trial.mode(first_eval) == modes.EVAL and trial.mode_step(first_eval) == 0
    assert eval_loss.value(0, mode=modes.EVAL) == eval_loss.value(first_eval)


def test_smdebug_parameter_names_are_accepted(out_dir):
    # smdebug writes Net_fc1.weight and gradient/Net_fc1.weight
    tr = create_trial(out_dir)
    assert tr.tensor("Net_fc1.weight").steps() == tr.tensor("fc1.weight").steps() != []
    grad = tr.tensor("gradient/Net_fc1.weight")
    # the hook writes smdebug's names on disk; the module-path spelling resolves to the same tensor
    assert grad.name == "gradient/Net_fc1.weight"
    assert tr.tensor("gradient/fc1.weight").steps() == grad.steps() != []
    assert tr.has_tensor("Net_conv1.bias") and not tr.has_tensor("Net_conv9.bias")


def test_an_unknown_tensor_is_a_clear_error(out_dir):
    tr = create_trial(out_dir)
    with pytest.raises(TensorUnavailable, match=r"no tensor 'Net_fc9\.weight' was saved"):
        tr.tensor("Net_fc9.weight").steps()
    with pytest.raises(TensorUnavailableForStep, match="worker_3 wrote nothing at step 0"):
        tr.tensor("fc1.weight").stats(0, worker="worker_3")
    with pytest.raises(StepUnavailable):
        tr.tensor("fc1.weight").value(8)  # a step nothing was saved at


def test_collection_calls(out_dir):
    # smdebug tests/pytorch/test_collection.py and the analysis notebooks
    tr = create_trial(out_dir)
    assert len(tr.tensor_names(collection="weights")) > 0
    assert tr.collection("weights").tensor_names == set(tr.tensor_names(collection="weights"))
    assert {"weights", "biases", "gradients", "losses"} <= set(tr.collections())
    assert "relu0_input_0" in tr.tensor_names(collection="default")
    with pytest.raises(KeyError, match="no collection 'nope'"):
        tr.collection("nope")


def test_workers_and_step_state_calls(out_dir):
    # smdebug tests/pytorch/test_distributed_training.py and rule code
    tr = create_trial(out_dir)
    assert tr.workers() == ["worker_0"]
    t = tr.tensor("gradient/Net_fc1.weight")
    assert t.workers(0) == ["worker_0"]
    with pytest.raises(TensorUnavailableForStep, match="only statistics were saved"):
        t.value(0, worker="worker_0")
    assert tr.has_passed_step(3) == StepState.AVAILABLE
    assert tr.has_passed_step(10_000) == StepState.UNAVAILABLE  # the job ended
    assert tr.loaded_all_steps and tr.last_complete_step == max(tr.steps())
    assert set(t.reduction_values(0)) >= {("mean", False), ("l2", False), ("mean", True)}
    assert t.shape(0) == (10, 1600)
    assert t.prev_steps(4, n=2) == [3, 4]


def _segment_job(root: Path, tensors_per_step: int = 2, steps: int = 6) -> Path:
    """A format-2 job: two workers, each one segment per 3 steps, TRAIN then EVAL."""
    job = root / "seg-job"
    job.mkdir(parents=True)
    (job / MANIFEST).write_text(
        json.dumps(
            {
                "format": "trainguard.manifest/1",
                "job": "seg-job",
                "created": 1.0,
                "hook_version": "t",
                "world_size": 2,
            }
        )
    )
    for worker in (0, 1):
        prev = None
        for seq, first in enumerate(range(0, steps, 3)):
            entries, blobs = [], {}
            for step in range(first, first + 3):
                mode = "TRAIN" if step < steps - 1 else "EVAL"
                mode_step = step if mode == "TRAIN" else 0
                tensors = {}
                for i in range(tensors_per_step):
                    value = np.full((4, 4), step + worker + i, dtype=np.float32)
                    name = f"layer{i}.weight"
                    tensors[name] = TensorRecord(
                        collections=["weights"],
                        dtype="float32",
                        shape=[4, 4],
                        stats=numpy_stats(value),
                        stored=i == 0,
                    )
                    if i == 0:
                        blobs[segment_tensor_key(step, mode, name)] = stepfile.TensorBlob.from_numpy(value)
                entries.append(
                    SegmentStep(
                        step=step,
                        wall_time=10.0 + step,
                        modes={mode: ModeRecord(mode_step=mode_step, tensors=tensors)},
                    )
                )
            header = SegmentHeader(
                job="seg-job", worker=worker, world_size=2, seq=seq, prev_step=prev, first_step=first,
                last_step=first + 2, opened=1.0, closed=2.0, reason="time", steps=entries,
            )  # fmt: skip
            key = job / segment_key(worker, seq, first, first + 2)
            key.parent.mkdir(parents=True, exist_ok=True)
            key.write_bytes(encode_segment(header, blobs))
            prev = first + 2
    return job


def test_format2_segments_read_like_steps(tmp_path):
    tr = create_trial(_segment_job(tmp_path))
    assert tr.steps() == [0, 1, 2, 3, 4, 5]
    assert tr.steps(mode=modes.EVAL) == [0] and tr.global_step(modes.EVAL, 0) == 5
    assert tr.workers() == ["worker_0", "worker_1"]
    w = tr.tensor("layer0.weight")
    assert w.workers(4) == ["worker_0", "worker_1"]
    assert float(w.value(4, worker="worker_1")[0, 0]) == 5.0  # read from the segment's body
    assert w.reduction_value(4, "mean", worker=1) == pytest.approx(5.0)
    assert tr.header(4, 1).prev_step == 3 and tr.header(3, 0).prev_step == 2


def test_the_header_cache_is_bounded_in_bytes(tmp_path):
    job = _segment_job(tmp_path, tensors_per_step=2000, steps=12)  # ~0.5 MB headers
    sizes = [stepfile.header_length(p.read_bytes()[:8]) for p in job.rglob("*.safetensors")]
    assert min(sizes) > 300_000
    bound = 3 * max(sizes) * 10
    tr = create_trial(job, cache_bytes=bound)
    for step in tr.steps():
        for worker in (0, 1):
            tr.tensor("layer7.weight").stats(step, worker=worker)
            assert tr.cached_header_bytes <= bound
    assert tr.tensor("layer0.weight").value(0, mode=modes.EVAL, worker=0).shape == (4, 4)
