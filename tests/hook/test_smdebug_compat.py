"""smdebug's PyTorch hook calls, made the way smdebug's own tests and examples make them.

Only the import changed (``import trainguard as smd``; ``smdebug.pytorch.Hook`` ->
``trainguard.Hook``, ``smdebug.core.modes.ModeKeys`` -> ``trainguard.modes.ModeKeys``). What is
written is checked through the format-2 contract (``segment_reader``); reading it back with
smdebug's trial API is the trial's own suite (tests/compat).
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import trainguard as smd
from segment_reader import JobView
from torch.autograd import Variable
from trainguard import CollectionKeys, Hook, ReductionConfig, SaveConfig, SaveConfigMode
from trainguard.modes import ModeKeys


class Net(nn.Module):
    """smdebug's tests/pytorch/utils.py model: adds a module to a collection while being built."""

    def __init__(self) -> None:
        super().__init__()
        self.add_module("conv1", nn.Conv2d(1, 20, 5, 1))
        self.add_module("relu0", nn.ReLU())
        self.add_module("max_pool", nn.MaxPool2d(2, stride=2))
        self.add_module("conv2", nn.Conv2d(20, 50, 5, 1))
        relu_module = nn.ReLU()
        self.add_module("relu1", relu_module)
        smd.get_hook().get_collection("relu_activations").add_module_tensors(relu_module)
        self.add_module("max_pool2", nn.MaxPool2d(2, stride=2))
        self.add_module("fc1", nn.Linear(4 * 4 * 50, 500))
        self.add_module("relu2", nn.ReLU())
        self.add_module("fc2", nn.Linear(500, 10))

    def forward(self, x):
        x = self.relu0(self.conv1(x))
        x = self.max_pool(x)
        x = self.relu1(self.conv2(x))
        x = self.max_pool2(x)
        x = x.view(-1, 4 * 4 * 50)
        x = self.relu2(self.fc1(x))
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def train(model, hook, device, optimizer, num_steps=500, set_modes=False, save_custom_tensor=False):
    if set_modes:
        hook.set_mode(smd.modes.TRAIN)
    model.train()
    if save_custom_tensor:
        hook.save_tensor("custom_tensor", torch.tensor([[1.0, -1.0], [1.0, -1.0]]))
    for _ in range(num_steps):
        data, target = torch.rand(32, 1, 28, 28), torch.rand(32).long()
        optimizer.zero_grad()
        output = model(Variable(data, requires_grad=True))
        loss = F.nll_loss(output, target)
        hook.record_tensor_value("nll_loss", tensor_value=loss)
        loss.backward()
        optimizer.step()


class SimpleNet(nn.Module):
    """smdebug's tests/pytorch/test_simple_write.py model."""

    def __init__(self) -> None:
        super().__init__()
        self.add_module("fc1", nn.Linear(20, 500))
        self.add_module("relu1", nn.ReLU())
        self.add_module("fc2", nn.Linear(500, 10))
        self.add_module("relu2", nn.ReLU())
        self.add_module("fc3", nn.Linear(10, 4))

    def forward(self, x_in):
        return F.log_softmax(self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x_in))))), dim=1)


def train_simple(model, optimizer, num_steps):
    model.train()
    for _ in range(num_steps):
        data, target = torch.rand(32, 20), torch.rand(32).long()
        optimizer.zero_grad()
        output = model(Variable(data, requires_grad=True))
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()


@pytest.fixture(autouse=True)
def _no_current_hook():
    smd.del_hook()
    yield
    smd.del_hook()


def test_save_custom_tensor_and_get_hook(tmp_path):
    """tests/pytorch/test_save_custom_tensor.py: get_hook() in the model, save_tensor, record_tensor_value."""
    out_dir = str(tmp_path / "trial_custom")
    hook = Hook(
        out_dir=out_dir,
        save_config=SaveConfig(save_steps=[0, 1, 2, 3]),
        include_collections=["relu_activations"],
    )
    model = Net().to(torch.device("cpu"))
    hook.register_module(model)
    optimizer = optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    train(model, hook, torch.device("cpu"), optimizer, num_steps=10, save_custom_tensor=True)
    hook.close()
    job = JobView(out_dir)
    assert job.tensor_names(collection=CollectionKeys.DEFAULT) == ["custom_tensor"]
    np.testing.assert_array_equal(job.value("custom_tensor", 0), [[1.0, -1.0], [1.0, -1.0]])
    # add_module_tensors(relu_module): its output (smdebug's default: outputs only), at the save steps
    assert job.tensor_names(collection="relu_activations") == ["relu1_output_0"]
    assert job.tensor_steps("relu1_output_0") == [0, 1, 2, 3]
    # record_tensor_value("nll_loss", ...): "nll_loss_output_0", a loss, never throttled
    assert sorted(job.scalars(collection="losses")["nll_loss_output_0"]) == list(range(10))


@pytest.mark.parametrize("hook_type", ["saveall", "weights-bias-gradients", "module-input-output"])
def test_test_simple_write_hooks(tmp_path, hook_type):
    """tests/pytorch/test_simple_write.py's create_hook() variants and register_hook()."""
    out_dir = str(tmp_path / hook_type)
    save_steps = [i * 20 for i in range(5)]
    model = SimpleNet()
    if hook_type == "saveall":
        hook = Hook(out_dir=out_dir, save_config=SaveConfig(save_steps=save_steps), save_all=True)
    elif hook_type == "module-input-output":
        hook = Hook(
            out_dir=out_dir,
            save_config=SaveConfig(save_steps=save_steps),
            include_collections=[
                CollectionKeys.WEIGHTS,
                CollectionKeys.GRADIENTS,
                CollectionKeys.BIASES,
                "l_mod",
            ],
        )
        hook.get_collection("l_mod").add_module_tensors(model.fc2, inputs=True, outputs=True)
    else:
        hook = Hook(
            out_dir=out_dir,
            save_config=SaveConfig(save_steps=save_steps),
            include_collections=[
                CollectionKeys.WEIGHTS,
                CollectionKeys.BIASES,
                CollectionKeys.GRADIENTS,
                CollectionKeys.DEFAULT,
                CollectionKeys.LOSSES,
            ],
        )
    hook.register_hook(model)
    optimizer = optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    train_simple(model, optimizer, num_steps=101)
    hook._cleanup()
    job = JobView(out_dir)
    grads = [
        f"gradient/Net_{n}"
        for n in ("fc1.weight", "fc2.weight", "fc3.weight", "fc1.bias", "fc2.bias", "fc3.bias")
    ]
    grads = [g.replace("Net_", "SimpleNet_") for g in grads]
    params = [g.removeprefix("gradient/") for g in grads]
    names = set(job.tensor_names())
    assert job.steps() == save_steps
    assert set(grads + params) <= names
    for step in save_steps:
        for name in grads + params:
            assert step in job.tensor_steps(name)
    if hook_type == "saveall":
        io = ["fc1_input_0", "relu1_input_0", "fc2_input_0", "relu2_input_0", "fc3_input_0"]
        io += ["fc1_output_0", "relu1_output_0", "fc2_output_0", "relu2_output_0", "fc3_output_0"]
        assert set(io) <= names
        assert job.record("SimpleNet_fc1.weight", 20).stored  # save_all saves tensors in full
    if hook_type == "module-input-output":
        assert job.tensor_names(collection="l_mod") == ["fc2_input_0", "fc2_output_0"]


def test_create_from_json_file_multi_collections(tmp_path, monkeypatch):
    """tests/pytorch/test_simple_write.py::test_multi_collection_json (the same JSON file)."""
    out_dir = tmp_path / "test_hook_multi_collection" / "jsonloading"
    config = {
        "S3Path": "s3://kjndjknd_bucket/prefix",
        "LocalPath": str(out_dir),
        "HookParameters": {"save_all": False, "save_steps": "0, 1, 2, 3"},
        "CollectionConfigurations": [
            {"CollectionName": "weights"},
            {"CollectionName": "biases"},
            {"CollectionName": "gradients"},
            {"CollectionName": "default"},
            {
                "CollectionName": "ReluActivation",
                "CollectionParameters": {"include_regex": "relu*", "save_steps": "4, 5, 6"},
            },
            {
                "CollectionName": "fc1",
                "CollectionParameters": {"include_regex": "fc1*", "save_steps": "7, 8, 9"},
            },
        ],
    }
    path = tmp_path / "test_hook_multi_collections.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(path))
    monkeypatch.delenv("TRAINING_JOB_NAME", raising=False)
    hook = Hook.create_from_json_file()
    model = SimpleNet()
    hook.register_hook(model)
    train_simple(model, optim.SGD(model.parameters(), lr=0.001, momentum=0.9), num_steps=101)
    hook.close()
    job = JobView(out_dir)
    assert job.steps() == list(range(10))
    names = set(job.tensor_names())
    for name in [
        "fc1_input_0",
        "relu1_input_0",
        "relu2_input_0",
        "fc1_output_0",
        "relu1_output_0",
        "relu2_output_0",
    ]:
        assert name in names
    assert job.tensor_steps("relu1_output_0") == [4, 5, 6]
    # weights at the hook's steps, and at fc1's: "fc1*" is re.search'd, so it takes "fc2" too
    assert job.tensor_steps("SimpleNet_fc2.weight") == [0, 1, 2, 3, 7, 8, 9]
    assert job.record("SimpleNet_fc2.weight", 0).stored  # no reductions configured: the full tensor


def test_create_from_json_file_without_a_file_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(tmp_path / "absent.json"))
    assert Hook.create_from_json_file() is None
    with pytest.raises(FileNotFoundError, match=r"absent\.json"):
        Hook.create_from_json_file(str(tmp_path / "absent.json"))


@pytest.mark.parametrize(
    "save_config",
    [
        SaveConfig(save_steps=[0, 2, 4, 6, 8]),
        SaveConfig(
            {
                ModeKeys.TRAIN: SaveConfigMode(save_interval=2),
                ModeKeys.GLOBAL: SaveConfigMode(save_interval=3),
                ModeKeys.EVAL: SaveConfigMode(save_interval=1),
            }
        ),
    ],
    ids=["save_steps", "per_mode"],
)
@pytest.mark.parametrize("register_loss", [True, False])
def test_save_scalar_before_during_after_training(tmp_path, save_config, register_loss):
    """tests/pytorch/test_hook_save_scalar_pytorch.py: save_scalar with sm_metric and timestamp."""
    hook = Hook(
        out_dir=str(tmp_path / "scalars"),
        include_collections=["scalars"],
        save_config=save_config,
        export_tensorboard=True,
    )
    model = SimpleNet()
    criterion = nn.NLLLoss()
    hook.register_module(model)
    if register_loss:
        hook.register_loss(criterion)
    hook.save_scalar("pt_num_steps", 10, sm_metric=True, timestamp=time.time())
    hook.save_scalar("pt_before_train", 1, sm_metric=False)
    hook.set_mode(ModeKeys.TRAIN)
    optimizer = optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    for _ in range(10):
        data, target = torch.rand(32, 20), torch.rand(32).long()
        optimizer.zero_grad()
        output = model(Variable(data, requires_grad=True))
        loss = criterion(output, target) if register_loss else F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
    hook.save_scalar("pt_after_train", 1, sm_metric=False)
    hook.set_mode(ModeKeys.EVAL)
    with torch.no_grad():
        for _ in range(10):
            data, target = torch.rand(32, 20), torch.rand(32).long()
            output = model(data)
            loss = criterion(output, target) if register_loss else F.nll_loss(output, target)
    hook.close()
    scalars = JobView(tmp_path / "scalars").scalars(mode="TRAIN")
    # explicit scalars are written whatever the save config says, at the step they were saved
    assert scalars["pt_num_steps"] == {0: 10.0} and scalars["pt_before_train"] == {0: 1.0}
    assert scalars["pt_after_train"] == {9: 1.0}


def test_reduction_config_as_smdebug_test_reduce_config_uses_it(tmp_path):
    """tests/pytorch/test_reduce_config.py: hook-wide and per-collection ReductionConfig."""
    global_reduce_config = ReductionConfig(reductions=["max", "mean", "variance"])
    global_save_config = SaveConfig(save_steps=[0, 1, 2, 3])
    hook = Hook(
        out_dir=str(tmp_path / "reduce"),
        save_config=global_save_config,
        include_collections=["weights", "bias", "gradients", "default", "ReluActivation", "flatten"],
        reduction_config=global_reduce_config,
    )
    hook.get_collection("ReluActivation").include(["relu*"])
    hook.get_collection("ReluActivation").set_save_config(SaveConfig(save_steps=[4, 5, 6]))
    hook.get_collection("ReluActivation").set_reduction_config(
        ReductionConfig(reductions=["min"], abs_reductions=["max"])
    )
    model = Net()
    hook.register_hook(model)
    train(
        model, hook, torch.device("cpu"), optim.SGD(model.parameters(), lr=0.001, momentum=0.9), num_steps=10
    )
    hook.close()
    job = JobView(tmp_path / "reduce")
    assert job.steps() == list(range(10))  # the weights' steps, the relu steps, and every loss
    weight = job.stats("Net_conv1.weight", 1)
    assert weight.max is not None and weight.mean is not None and weight.std is not None
    relu_input = job.stats("relu0_input_0", 4)
    assert relu_input.min is not None and relu_input.max is not None


def test_functional_loss_as_test_loss_records_it(tmp_path):
    """tests/pytorch/test_loss.py: record_tensor_value(tensor_name=..., tensor_value=...), del_hook."""

    class CifarNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.pool, self.conv2 = nn.Conv2d(3, 6, 5), nn.MaxPool2d(2, 2), nn.Conv2d(6, 16, 5)
            self.fc1, self.fc2, self.fc3 = nn.Linear(16 * 5 * 5, 120), nn.Linear(120, 84), nn.Linear(84, 10)

        def forward(self, x):
            x = self.pool(F.relu(self.conv1(x)))
            x = self.pool(F.relu(self.conv2(x)))
            x = x.view(-1, 16 * 5 * 5)
            return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))

    net = CifarNet()
    optimizer = optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    hook = smd.Hook(out_dir=str(tmp_path / "loss"), save_config=smd.SaveConfig(save_interval=1))
    hook.register_hook(net)
    inputs, labels = torch.rand(1, 3, 32, 32), torch.zeros(1).long()
    for _ in range(5):
        optimizer.zero_grad()
        loss = F.cross_entropy(net(inputs), labels)
        hook.record_tensor_value(tensor_name="cross_entropy_loss", tensor_value=loss)
        loss.backward()
        optimizer.step()
    hook.close()
    smd.del_hook()
    losses = JobView(tmp_path / "loss").scalars(collection="losses")["cross_entropy_loss_output_0"]
    assert sorted(losses) == [0, 1, 2, 3, 4] and losses[0] > losses[4]


def test_save_scalar_my_loss_is_saved_without_scalars_included(tmp_path):
    with Hook(out_dir=str(tmp_path / "my"), include_collections=["weights"]) as hook:
        hook.save_scalar("my_loss", 0.5)
    assert JobView(tmp_path / "my").scalars(collection="losses") == {"my_loss": {0: 0.5}}
