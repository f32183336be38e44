"""The PyTorch integration on real small models: steps, weights, gradients, activations, losses."""

import logging
import math

import numpy as np
import pytest
import torch
import trainguard
from torch import nn
from trainguard import Collection, SaveConfig, modes
from trainguard.hook.stats import numpy_stats

pytestmark = pytest.mark.torch


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Sigmoid(), nn.Linear(8, 3)
    )


def run(model, hook, steps, record=None, lr=0.1):
    crit = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(crit)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        loss = crit(model(x), y)
        loss.backward()
        if record is not None:
            record[step] = {
                "loss": loss.item(),
                "weights": weights,
                "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters()},
                "y": y.clone(),
            }
        opt.step()
    return crit


def test_torch_loop_round_trip(tmp_path):
    out = tmp_path / "torch-job"
    cols = [
        "losses",
        "weights",
        "biases",
        "gradients",
        "relu_output",
        "relu_input",
        "tanh_input",
        "sigmoid_input",
        "labels",
        "predictions",
    ]
    full = [
        Collection(c, SaveConfig(save_interval=2), save_full=True) for c in ("weights", "biases", "gradients")
    ]
    record = {}
    model = mlp()
    with trainguard.Hook(
        out, save_config=SaveConfig(save_interval=2), include_collections=cols, collections=full
    ) as hook:
        crit = run(model, hook, 5, record)
        hook.set_mode(modes.EVAL)
        with torch.no_grad():
            crit(model(torch.randn(4, 6)), torch.tensor([0, 1, 2, 0]))
    trial = trainguard.create_trial(out)
    assert trial.steps() == [0, 2, 4, 5]
    # smdebug's semantics: with a mode, steps are that mode's own (EVAL's first is 0)
    assert trial.steps(mode="EVAL") == [0] and trial.global_step("EVAL", 0) == 5
    assert trial.manifest.frameworks[0].name == "pytorch"
    for step in (0, 2, 4):
        rec = record[step]
        assert trial.tensor("CrossEntropyLoss_output_0").value(step) == pytest.approx(rec["loss"])
        for name, w in rec["weights"].items():
            np.testing.assert_array_equal(trial.tensor(name).value(step), w.numpy())
            got = trial.tensor(f"gradient/{name}")
            np.testing.assert_array_equal(got.value(step), rec["grads"][name].numpy())
            want = numpy_stats(rec["grads"][name].numpy())
            assert got.stats(step).mean_abs == pytest.approx(want.mean_abs, rel=1e-5)
        assert trial.tensor("CrossEntropyLoss/labels").stats(step).values == [float(v) for v in rec["y"]]
    names = trial.tensor_names(step=2)
    for expected in (
        "1/relu_output",
        "1/relu_input",
        "3/tanh_input",
        "5/sigmoid_input",
        "CrossEntropyLoss/predictions",
    ):
        assert expected in names
    relu = trial.tensor("1/relu_output").stats(2)
    assert len(relu.unit_active) == 8 and relu.samples == 16 and relu.min >= 0
    tanh = trial.tensor("3/tanh_input").stats(2)
    assert tanh.band == (-9.4999, 9.4999) and len(tanh.unit_in_band) == 8
    assert trial.tensor("gradient/0.weight").stats(2).percentiles.keys() == {"5", "50", "95"}
    # parameters and gradients are written in the model's parameter order
    header_names = list(trial.header(2).modes["TRAIN"].tensors)
    grads = [n for n in header_names if n.startswith("gradient/")]
    assert grads == [f"gradient/{n}" for n, _ in model.named_parameters()]
    # EVAL step: weights and loss, no gradients
    eval_names = trial.tensor_names(step=0, mode="EVAL")  # EVAL's step 0 (global step 5)
    assert "0.weight" in eval_names and not any(n.startswith("gradient/") for n in eval_names)


def test_default_config_and_step_counting(tmp_path):
    with trainguard.Hook(tmp_path / "d") as hook:
        run(mlp(), hook, 52)
        assert hook.step == 51
    trial = trainguard.create_trial(tmp_path / "d")
    assert trial.steps() == list(range(52))  # losses every step
    assert trial.tensor("gradient/0.weight").steps() == [0, 50]  # tensor statistics every 50
    assert trial.tensor("0.bias").steps() == [0, 50]
    assert trial.tensor("1/relu_output").steps() == [0, 50]
    assert "1/relu_input" not in trial.tensor_names()  # not a default collection
    assert trial.tensor("0.weight").record(0).stored is False
    with pytest.raises(trainguard.trial.TensorUnavailable, match="only statistics"):
        trial.tensor("0.weight").value(0)


def test_conv_relu_units_are_channels(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 5, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(1, 3, 8, 8))
    with trainguard.Hook(tmp_path / "cnn", include_collections=["relu_output"]) as hook:
        hook.register_module(model)
        model(torch.randn(4, 3, 8, 8))
    stats = trainguard.create_trial(tmp_path / "cnn").tensor("1/relu_output").stats(0)
    assert len(stats.unit_active) == 5 and stats.samples == 4


def test_reused_relu_module_gets_suffixes(tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.act = nn.Linear(4, 4), nn.Linear(4, 4), nn.ReLU()

        def forward(self, x):
            return self.act(self.b(self.act(self.a(x))))

    with trainguard.Hook(tmp_path / "r", include_collections=["relu_output"]) as hook:
        hook.register_module(Net())
        Net.forward(hook._torch.top, torch.randn(2, 4))
        hook._torch.top(torch.randn(2, 4))
    names = trainguard.create_trial(tmp_path / "r").tensor_names(step=0)
    assert names == ["act/relu_output", "act/relu_output_1"]


def test_update_l2_when_weight_update_ratio_declared(tmp_path):
    rules = [{"RuleConfigurationName": "wur", "RuleParameters": {"rule_to_invoke": "WeightUpdateRatio"}}]
    record = {}
    with trainguard.Hook(
        tmp_path / "u", save_config=SaveConfig(save_interval=1), include_collections=["weights"], rules=rules
    ) as hook:
        run(mlp(), hook, 3, record)
    t = trainguard.create_trial(tmp_path / "u").tensor("0.weight")
    assert t.stats(0).update_l2 is None
    want = float(
        np.linalg.norm((record[2]["weights"]["0.weight"] - record[1]["weights"]["0.weight"]).numpy())
    )
    assert t.stats(2).update_l2 == pytest.approx(want, rel=1e-5)
    assert (
        "update_l2"
        in next(
            c for c in trainguard.create_trial(tmp_path / "u").manifest.collections if c.name == "weights"
        ).reductions
    )


def test_include_regex_saves_matching_module_outputs(tmp_path):
    model = mlp()
    with trainguard.Hook(
        tmp_path / "x",
        include_collections=["losses"],
        include_regex=["2_output_0", "gradient/6.*"],
        save_config=SaveConfig(save_interval=1),
    ) as hook:
        run(model, hook, 2)
    names = trainguard.create_trial(tmp_path / "x").tensor_names(step=1, collection="default")
    assert names == ["2_output_0", "gradient/6.bias", "gradient/6.weight"]


def test_inputs_and_outputs_collections(tmp_path):
    model = mlp()
    with trainguard.Hook(tmp_path / "io", include_collections=["inputs", "outputs"]) as hook:
        hook.register_module(model)
        x = torch.randn(3, 6)
        out = model(x)
    trial = trainguard.create_trial(tmp_path / "io")
    assert trial.tensor("model_input_0").stats(0).mean == pytest.approx(float(x.mean()), rel=1e-5)
    assert trial.tensor("model_output_0").stats(0).max == pytest.approx(float(out.detach().max()), rel=1e-5)


def test_internal_error_in_torch_hook_disables_and_training_continues(tmp_path, monkeypatch, caplog):
    def broken(*a, **k):
        raise RuntimeError("kaput")

    monkeypatch.setattr("trainguard.hook.core.torch_stats", broken)
    model = mlp()
    with caplog.at_level(logging.ERROR, logger="trainguard.hook"), trainguard.Hook(tmp_path / "k") as hook:
        run(model, hook, 4)
        assert hook.disabled
        assert hook._torch.handles == []  # module hooks removed: no cost left in the loop
    assert caplog.text.count("disables itself") == 1
    assert all(math.isfinite(float(p.detach().sum())) for p in model.parameters())


def test_register_loss_needs_a_module(tmp_path, caplog):
    with caplog.at_level(logging.ERROR, logger="trainguard.hook"), trainguard.Hook(tmp_path / "l") as hook:
        hook.register_loss(lambda a, b: a)
        assert hook.disabled
    assert "register_loss needs a torch.nn.Module" in caplog.text


def test_rank_from_torch_distributed(tmp_path, monkeypatch):
    import torch.distributed as dist
    from trainguard.hook.env import rank_and_world

    monkeypatch.setenv("RANK", "3")  # torch.distributed, when initialised, wins over the environment
    monkeypatch.setenv("WORLD_SIZE", "8")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        assert rank_and_world() == (0, 1)
    finally:
        dist.destroy_process_group()
    assert rank_and_world() == (3, 8)
