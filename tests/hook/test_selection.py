"""Statistics chosen by the rules: each configured rule's ``reads()`` decides what the hook records.

Custom rules (``trainguard.rules.plugins``) declare reads the built-ins do not, and every
built-in rule is run against the default hook configuration to show it gets what it reads.
"""

from __future__ import annotations

import logging
import textwrap

import numpy as np
import pytest
import torch
import trainguard
from segment_reader import JobView
from torch import nn
from trainguard import SaveConfig, modes
from trainguard.hook.selection import ReadDeclaration
from trainguard.rules import plugins
from trainguard.rules.plugins import ENV_VAR
from trainguard.rules.registry import RULES

CUSTOM = """
from trainguard.rules.base import Rule, RuleConfig, RuleInput, RuleState


class _Base(Rule):
    Config = RuleConfig
    State = RuleState

    def update(self, state, step):
        return state, []


class WeightMeanWatcher(_Base):
    name = "WeightMeanWatcher"

    def reads(self):
        means = RuleInput("TRAIN means", collections=("weights",), statistics=("mean",), modes=("TRAIN",))
        return (means,)


class TanhWatcher(_Base):
    name = "TanhWatcher"

    def reads(self):
        return (RuleInput("tanh inputs", collections=("tanh_input",), statistics=("unit_in_band", "band")),)


class RegexWatcher(_Base):
    name = "RegexWatcher"

    def reads(self):
        return (RuleInput("the last layer", regex=("Sequential_2\\\\.weight$",), statistics=("max",)),)


class Undeclared(_Base):
    name = "Undeclared"


RULES = [WeightMeanWatcher, TanhWatcher, RegexWatcher, Undeclared]
"""


@pytest.fixture(autouse=True)
def custom_rules(tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.mktemp("rules")
    (folder / "selection_rules.py").write_text(textwrap.dedent(CUSTOM))
    monkeypatch.setenv(ENV_VAR, f"{folder}:selection_rules")
    plugins.reset()
    yield
    plugins.reset()


def rule(name: str, **params: str) -> dict:
    return {"RuleConfigurationName": name, "RuleParameters": {"rule_to_invoke": name, **params}}


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))


def train(hook, model, steps=3, eval_steps=1):
    crit = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(crit)
    for _ in range(steps):
        crit(model(torch.randn(8, 4)), torch.randint(0, 3, (8,))).backward()
    hook.set_mode(modes.EVAL)
    with torch.no_grad():
        for _ in range(eval_steps):
            crit(model(torch.randn(8, 4)), torch.randint(0, 3, (8,)))


def test_a_rule_turns_on_its_collection_and_gets_only_its_statistics(tmp_path):
    every = SaveConfig(save_interval=1)
    with trainguard.Hook(tmp_path / "w", rules=[rule("WeightMeanWatcher")], save_config=every) as hook:
        assert "weights" in hook.collections and "gradients" not in hook.collections
        train(hook, small_model())
    job = JobView(tmp_path / "w")
    stats = job.stats("Sequential_0.weight", 0)
    assert stats.mean is not None and stats.std is None and stats.min is None and stats.nan is None
    assert "Sequential_0.bias" not in job.tensor_names()  # biases are not weights
    # the rule reads TRAIN only: nothing is computed for the EVAL step
    assert (
        job.tensor_names(step=3, mode="EVAL") == ["CrossEntropyLoss_output_0"]
        or not job.mode(3, "EVAL").tensors
    )


def test_a_regex_input_records_exactly_that_tensor(tmp_path):
    every = SaveConfig(save_interval=1)
    with trainguard.Hook(tmp_path / "r", rules=[rule("RegexWatcher")], save_config=every) as hook:
        train(hook, small_model(), eval_steps=0)
    job = JobView(tmp_path / "r")
    assert job.tensor_names(collection="default") == ["Sequential_2.weight"]
    stats = job.stats("Sequential_2.weight", 0)
    assert stats.max is not None and stats.mean is None


def test_a_rule_whose_input_nothing_produces_is_warned_about_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trainguard.hook"):
        with trainguard.Hook(tmp_path / "t", rules=[rule("TanhWatcher")]) as hook:
            assert "tanh_input" in hook.collections  # turned on for the rule
            train(hook, small_model())  # ... but the model has no nn.Tanh
    warnings = [r.getMessage() for r in caplog.records if "TanhWatcher" in r.getMessage()]
    assert len(warnings) == 1
    assert "tanh_input" in warnings[0] and "will see nothing" in warnings[0]


def test_saturated_activation_gets_tanh_inputs_when_the_model_has_them(tmp_path):
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    with trainguard.Hook(
        tmp_path / "s", rules=[rule("TanhWatcher")], save_config=SaveConfig(save_interval=1)
    ) as hook:
        train(hook, model)
    stats = JobView(tmp_path / "s").stats("1/tanh_input", 0)
    assert len(stats.unit_in_band) == 6 and stats.band == (-9.4999, 9.4999) and stats.mean is None


def test_undeclared_and_unknown_rules_get_the_former_defaults(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trainguard.hook"):
        with trainguard.Hook(tmp_path / "u", rules=[rule("Undeclared"), rule("NoSuchRule")]) as hook:
            assert {"weights", "biases", "gradients", "relu_output"} <= set(hook.collections)
            train(hook, small_model())
    assert "cannot tell what it reads" in caplog.text and "NoSuchRule" in caplog.text
    stats = JobView(tmp_path / "u").stats("Sequential_0.weight", 0)
    assert stats.mean is not None and stats.std is not None and stats.nan == 0


def test_statistics_all_asks_for_every_field(tmp_path):
    every = SaveConfig(save_interval=1)
    with trainguard.Hook(
        tmp_path / "a", rules=[rule("WeightMeanWatcher")], statistics="all", save_config=every
    ) as hook:
        train(hook, small_model(), eval_steps=0)
    stats = JobView(tmp_path / "a").stats("Sequential_0.weight", 0)
    for field in ("numel", "mean", "std", "min", "max", "mean_abs", "l1", "l2", "zeros", "nan", "inf"):
        assert getattr(stats, field) is not None, field


def test_explicit_collections_and_saves_get_the_standard_statistics(tmp_path):
    with trainguard.Hook(
        tmp_path / "x", rules=[rule("WeightMeanWatcher")], include_collections=["biases"]
    ) as hook:
        train(hook, small_model(), eval_steps=0)
        hook.save_tensor("extra", np.ones(3), step=2)
    job = JobView(tmp_path / "x")
    bias = job.stats("Sequential_0.bias", 0)
    assert bias.std is not None and bias.zeros == 0  # the user asked for biases: the standard set
    assert job.stats("extra", 2, mode="EVAL").l2 == pytest.approx(3**0.5)


# ----------------------------------------------------------------------------- every built-in rule
XGBOOST_RULES = {"FeatureImportanceOverweight", "TreeDepth", "CreateXgboostReport"}
PARAMS = {"SimilarAcrossRuns": {"other_trials": "s3://bucket/jobs/other"}}


def builtin_rules():
    return sorted(
        name for name, cls in RULES.items() if getattr(cls, "kind", "model") in ("model", "cross-job")
    )


class Everything(nn.Module):
    """Linear+ReLU, Tanh and Sigmoid: every activation collection has tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.relu, self.fc2, self.tanh = nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 6), nn.Tanh()
        self.fc3, self.sig, self.out = nn.Linear(6, 6), nn.Sigmoid(), nn.Linear(6, 3)

    def forward(self, x):
        return self.out(self.sig(self.fc3(self.tanh(self.fc2(self.relu(self.fc1(x)))))))


class Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(20, 4), nn.Linear(4, 3)

    def forward(self, x):
        return self.out(self.emb(x).mean(1))


def covered(job: JobView, read: ReadDeclaration) -> bool:
    """Some record the input applies to carries every statistic it reads."""
    for step in job.steps():
        for mode, record in job.step(step).modes.items():
            if read.modes and mode not in read.modes:
                continue
            if read.scalars:
                if any(set(s.collections) & read.collections for s in record.scalars.values()):
                    return True
                continue
            for name, tensor in record.tensors.items():
                if read.applies(name, tensor.collections, mode) and tensor.stats is not None:
                    if all(getattr(tensor.stats, f) is not None for f in read.statistics):
                        return True
    return False


@pytest.mark.parametrize("name", [n for n in builtin_rules() if n not in XGBOOST_RULES])
def test_the_default_hook_gives_each_rule_everything_it_reads(tmp_path, name):
    entry = rule(name, **PARAMS.get(name, {}))
    with trainguard.Hook(tmp_path / "job", rules=[entry], stop_check_interval_s=0) as hook:
        tokens = name == "NLPSequenceRatio"
        model = Tokens() if tokens else Everything()
        crit = nn.CrossEntropyLoss()
        hook.register_module(model)
        hook.register_loss(crit)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        # an update norm needs two saves of the same mode: WeightUpdateRatio's job runs to the
        # second save of the weights (default interval 50)
        for step in range(51 if name == "WeightUpdateRatio" else 3):
            hook.set_mode(modes.TRAIN)
            x = torch.randint(0, 20, (8, 5)) if tokens else torch.randn(8, 4)
            opt.zero_grad()
            crit(model(x), torch.randint(0, 3, (8,))).backward()
            opt.step()
            hook.set_mode(modes.EVAL)
            with torch.no_grad():
                crit(model(x), torch.randint(0, 3, (8,)))
        reads = [r for r in hook.selection.reads if r.required]
    job = JobView(tmp_path / "job")
    missing = [r.what for r in reads if not covered(job, r)]
    assert not missing, f"{name} did not get: {missing}"


@pytest.mark.parametrize("name", sorted(XGBOOST_RULES))
def test_the_default_hook_gives_each_xgboost_rule_everything_it_reads(tmp_path, name):
    xgb = pytest.importorskip("xgboost")
    from trainguard.hook.xgboost_support import TrainguardCallback

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 5))
    y = (x[:, 0] > 0).astype(float)
    dtrain = xgb.DMatrix(x, label=y)
    with trainguard.Hook(tmp_path / "x", rules=[rule(name)], stop_check_interval_s=0) as hook:
        evals = [(dtrain, "train")]
        xgb.train(
            {"objective": "binary:logistic", "max_depth": 3},
            dtrain,
            3,
            evals=evals,
            verbose_eval=False,
            callbacks=[TrainguardCallback(hook, dtrain=dtrain, evals=evals)],
        )
        reads = [r for r in hook.selection.reads if r.required]
    job = JobView(tmp_path / "x")
    missing = [r.what for r in reads if not covered(job, r)]
    assert not missing, f"{name} did not get: {missing}"
