"""The PyTorch integration on real small models: steps, weights, gradients, activations, losses."""

import logging
import math

import numpy as np
import pytest
import torch
import trainguard
from segment_reader import JobView
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


def smd(name: str) -> str:
    """smdebug's name of an ``mlp()`` parameter: the model's class name, then its path."""
    return f"Sequential_{name}"


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
    job = JobView(out)
    assert job.steps() == [0, 2, 4, 5]
    assert job.steps(mode="EVAL") == [5]
    assert job.manifest.frameworks[0].name == "pytorch"
    for step in (0, 2, 4):
        rec = record[step]
        assert job.scalar("CrossEntropyLoss_output_0", step) == pytest.approx(rec["loss"])
        for name, w in rec["weights"].items():
            np.testing.assert_array_equal(job.value(smd(name), step), w.numpy())
            np.testing.assert_array_equal(
                job.value(f"gradient/{smd(name)}", step), rec["grads"][name].numpy()
            )
            want = numpy_stats(rec["grads"][name].numpy())
            assert job.stats(f"gradient/{smd(name)}", step).mean_abs == pytest.approx(want.mean_abs, rel=1e-5)
        assert job.stats("CrossEntropyLoss/labels", step).values == [float(v) for v in rec["y"]]
    names = job.tensor_names(step=2)
    for expected in (
        "1/relu_output",
        "1/relu_input",
        "3/tanh_input",
        "5/sigmoid_input",
        "CrossEntropyLoss/predictions",
    ):
        assert expected in names
    relu = job.stats("1/relu_output", 2)
    assert len(relu.unit_active) == 8 and relu.samples == 16 and relu.min >= 0
    tanh = job.stats("3/tanh_input", 2)
    assert tanh.band == (-9.4999, 9.4999) and len(tanh.unit_in_band) == 8
    assert job.stats(f"gradient/{smd('0.weight')}", 2).percentiles.keys() == {"5", "50", "95"}
    # parameters and gradients are written in the model's parameter order
    header_names = list(job.mode(2).tensors)
    grads = [n for n in header_names if n.startswith("gradient/")]
    assert grads == [f"gradient/{smd(n)}" for n, _ in model.named_parameters()]
    # EVAL step: weights and loss, no gradients
    eval_names = job.tensor_names(step=5, mode="EVAL")
    assert smd("0.weight") in eval_names and not any(n.startswith("gradient/") for n in eval_names)


def test_default_config_records_what_the_default_rules_read(tmp_path):
    with trainguard.Hook(tmp_path / "d") as hook:
        run(mlp(), hook, 52)
        assert hook.step == 51
    job = JobView(tmp_path / "d")
    assert job.steps() == list(range(52))  # losses every step
    grad = f"gradient/{smd('0.weight')}"
    assert job.tensor_steps(grad) == [0, 50]  # tensor statistics every 50
    assert job.tensor_steps("1/relu_output") == [0, 50]
    assert smd("0.bias") not in job.tensor_names()  # no default rule reads weights or biases
    assert "1/relu_input" not in job.tensor_names()
    # only what the rules read: VanishingGradient mean_abs, ExplodingTensor nan/inf, DeadRelu units
    stats = job.stats(grad, 0)
    assert stats.mean_abs is not None and (stats.nan, stats.inf) == (0, 0)
    assert stats.mean is None and stats.std is None and stats.percentiles is None
    relu = job.stats("1/relu_output", 0)
    assert relu.unit_active is not None and relu.nan == 0 and relu.min is None
    assert job.record(grad, 0).stored is False


def test_hooks_are_installed_only_on_due_steps(tmp_path):
    """A step with nothing due leaves every submodule on PyTorch's hook-free path."""
    model = mlp()
    seen = []

    def spy(module, args):
        seen.append(sum(len(m._forward_hooks) for m in model.modules()))

    with trainguard.Hook(
        tmp_path / "h",
        include_collections=["losses", "relu_output", "gradients"],
        save_config=SaveConfig(save_interval=3),
    ) as hook:
        hook.register_module(model)
        model.register_forward_pre_hook(spy)  # runs after the hook's pre-hook
        for _ in range(4):
            model(torch.randn(2, 6)).sum().backward()
    # due at 0 and 3: the relu hook and the top module's hook for gradients; none at 1 and 2
    assert seen == [2, 0, 0, 2]


def test_gradients_without_queue_callback_use_a_multi_gradient_hook(tmp_path, monkeypatch):
    monkeypatch.setattr("trainguard.hook.torch_support._can_queue_callback", lambda torch: False)
    record = {}
    with trainguard.Hook(
        tmp_path / "mg", include_collections=["gradients"], save_config=SaveConfig(save_interval=1)
    ) as hook:
        run(mlp(), hook, 2, record)
    job = JobView(tmp_path / "mg")
    want = float(np.abs(record[1]["grads"]["6.weight"].numpy()).mean())
    assert job.stats(f"gradient/{smd('6.weight')}", 1).mean_abs == pytest.approx(want, rel=1e-5)


def test_conv_relu_units_are_channels(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 5, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(1, 3, 8, 8))
    with trainguard.Hook(tmp_path / "cnn", include_collections=["relu_output"]) as hook:
        hook.register_module(model)
        model(torch.randn(4, 3, 8, 8))
    stats = JobView(tmp_path / "cnn").stats("1/relu_output", 0)
    assert len(stats.unit_active) == 5 and stats.samples == 4


def test_reused_relu_module_gets_suffixes(tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.act = nn.Linear(4, 4), nn.Linear(4, 4), nn.ReLU()

        def forward(self, x):
            return self.act(self.b(self.act(self.a(x))))

    net = Net()
    with trainguard.Hook(tmp_path / "r", include_collections=["relu_output"]) as hook:
        hook.register_module(net)
        net(torch.randn(2, 4))
    names = JobView(tmp_path / "r").tensor_names(step=0)
    assert names == ["act/relu_output", "act/relu_output_1"]


def test_update_l2_when_weight_update_ratio_declared(tmp_path):
    rules = [{"RuleConfigurationName": "wur", "RuleParameters": {"rule_to_invoke": "WeightUpdateRatio"}}]
    record = {}
    with trainguard.Hook(tmp_path / "u", save_config=SaveConfig(save_interval=1), rules=rules) as hook:
        run(mlp(), hook, 3, record)
    job = JobView(tmp_path / "u")
    name = smd("0.weight")
    assert job.stats(name, 0).update_l2 is None
    want = float(
        np.linalg.norm((record[2]["weights"]["0.weight"] - record[1]["weights"]["0.weight"]).numpy())
    )
    assert job.stats(name, 2).update_l2 == pytest.approx(want, rel=1e-5)
    assert job.stats(name, 2).l2 is not None  # what WeightUpdateRatio reads, nothing more
    assert job.stats(name, 2).mean is None


def test_include_regex_matches_smdebug_names_and_plain_parameter_names(tmp_path):
    model = mlp()
    with trainguard.Hook(
        tmp_path / "x",
        include_collections=["losses"],
        include_regex=["2_output_0", "gradient/6.*", "Sequential_4.bias"],
        save_config=SaveConfig(save_interval=1),
    ) as hook:
        run(model, hook, 2)
    names = JobView(tmp_path / "x").tensor_names(step=1, collection="default")
    # re.search, as smdebug matches: "Sequential_4.bias" also takes its gradient
    assert names == [
        "2_output_0",
        smd("4.bias"),
        f"gradient/{smd('4.bias')}",
        f"gradient/{smd('6.bias')}",
        f"gradient/{smd('6.weight')}",
    ]


def test_inputs_and_outputs_collections(tmp_path):
    model = mlp()
    with trainguard.Hook(tmp_path / "io", include_collections=["inputs", "outputs"]) as hook:
        hook.register_module(model)
        x = torch.randn(3, 6)
        out = model(x)
    job = JobView(tmp_path / "io")
    assert job.stats("Sequential_input_0", 0).mean == pytest.approx(float(x.mean()), rel=1e-5)
    assert job.stats("Sequential_output_0", 0).max == pytest.approx(float(out.detach().max()), rel=1e-5)


def test_add_module_tensors_and_save_all(tmp_path):
    model = mlp()
    custom = Collection("custom", SaveConfig(save_interval=1))
    custom.add_module_tensors(model[2], inputs=True, outputs=True)
    with trainguard.Hook(tmp_path / "am", include_collections=["losses"], collections=[custom]) as hook:
        run(model, hook, 1)
    assert JobView(tmp_path / "am").tensor_names(collection="custom") == ["2_input_0", "2_output_0"]
    with trainguard.Hook(tmp_path / "all", save_all=True, save_config=SaveConfig(save_interval=1)) as hook:
        run(mlp(), hook, 1)
    names = JobView(tmp_path / "all").tensor_names(collection="all")
    assert {smd("0.weight"), f"gradient/{smd('0.weight')}", "0_output_0", "1_input_0"} <= set(names)


def test_record_tensor_value_of_a_functional_loss(tmp_path):
    model = mlp()
    with trainguard.Hook(tmp_path / "f", include_collections=["losses"]) as hook:
        hook.register_module(model)
        out = model(torch.randn(4, 6))
        loss = nn.functional.mse_loss(out, torch.zeros_like(out))
        hook.record_tensor_value("my_loss", loss)
    job = JobView(tmp_path / "f")
    assert job.scalars(collection="losses") == {"my_loss_output_0": {0: pytest.approx(loss.item())}}


def test_internal_error_in_torch_hook_disables_and_training_continues(tmp_path, monkeypatch, caplog):
    def broken(*a, **k):
        raise RuntimeError("kaput")

    monkeypatch.setattr("trainguard.hook.core.torch_stats", broken)
    monkeypatch.setattr("trainguard.hook.core.torch_stats_many", broken)
    model = mlp()
    with (
        caplog.at_level(logging.ERROR, logger="trainguard.hook"),
        trainguard.Hook(tmp_path / "k", save_config=SaveConfig(save_interval=1)) as hook,
    ):
        run(model, hook, 4)
        assert hook.disabled
        assert not model._forward_pre_hooks  # module hooks removed: no cost left in the loop
        assert not any(m._forward_hooks for m in model.modules())
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


def test_update_l2_is_measured_between_saves_of_the_same_mode(tmp_path):
    # an evaluation between two training saves holds the weights the next training save holds:
    # measured across modes, that training update would read 0 and WeightUpdateRatio would fire
    rules = [{"RuleConfigurationName": "wur", "RuleParameters": {"rule_to_invoke": "WeightUpdateRatio"}}]
    w0, w1 = np.ones(16, dtype=np.float32), np.full(16, 1.5, dtype=np.float32)
    with trainguard.Hook(tmp_path / "m", rules=rules) as hook:
        hook.save_tensor("w", w0, collections=["weights"], step=0, mode="TRAIN", full=False)
        hook.save_tensor("w", w1, collections=["weights"], step=1, mode="EVAL", full=False)
        hook.save_tensor("w", w1, collections=["weights"], step=2, mode="TRAIN", full=False)
    weight = trainguard.create_trial(tmp_path / "m").tensor("w")
    assert weight.stats(2, mode="TRAIN").update_l2 == pytest.approx(float(np.linalg.norm(w1 - w0)))
    assert weight.stats(1, mode="EVAL").update_l2 is None  # the first EVAL save


def test_inplace_relu_keeps_dead_relu_and_poor_weight_initialization_statistics(tmp_path):
    """One tensor object is both an in-place ReLU's input and its output: each name keeps the
    statistics its own rule reads, and relu_input is the pre-activation (read before the ReLU)."""
    rules = [
        {"RuleConfigurationName": r, "RuleParameters": {"rule_to_invoke": r}}
        for r in ("DeadRelu", "PoorWeightInitialization")
    ]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(inplace=True), nn.Linear(16, 3))
    pre = {}

    def keep(module, args, output):  # returns None: the output stays the model's own
        pre["x"] = output.detach().clone()

    model[0].register_forward_hook(keep)
    with trainguard.Hook(tmp_path / "ip", save_config=SaveConfig(save_interval=1), rules=rules) as hook:
        hook.register_module(model)
        model(torch.randn(32, 6)).sum().backward()
    job = JobView(tmp_path / "ip")
    out, inp = job.stats("1/relu_output", 0), job.stats("1/relu_input", 0)
    assert out.unit_active is not None and len(out.unit_active) == 16
    assert inp.std == pytest.approx(float(pre["x"].std(unbiased=False)), rel=1e-5)
