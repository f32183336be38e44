"""The PyTorch integration records the model's structure (zero, constant, frozen or unused by
construction) in the manifest, and the rules that would misread those tensors leave them out."""

from __future__ import annotations

import math

import pytest
import torch
import trainguard
from segment_reader import JobView
from torch import nn
from trainguard import SaveConfig
from trainguard.engine.replay import replay
from trainguard.engine.sources import LocalJob
from trainguard.format import documents as d

pytestmark = pytest.mark.torch


class SelfAttention(nn.Module):
    """BERT's self-attention, by its layer names: softmax(q k^T) v."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.query, self.key, self.value = (
            nn.Linear(width, width),
            nn.Linear(width, width),
            nn.Linear(width, width),
        )

    def forward(self, x):
        scores = self.query(x) @ self.key(x).transpose(-1, -2) / math.sqrt(x.shape[-1])
        return torch.softmax(scores, dim=-1) @ self.value(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 16)  # frozen below: a fine-tuning's backbone
        self.conv = nn.Conv1d(16, 16, 3, padding=1)
        self.bn = nn.BatchNorm1d(16)  # fed by conv alone: conv.bias is removed
        self.conv_skip = nn.Conv1d(16, 16, 3, padding=1)
        self.bn_skip = nn.BatchNorm1d(16)  # conv_skip's output also skips it: its bias counts
        self.attention = SelfAttention(16)
        self.fc = nn.Linear(16, 16)
        self.ln = nn.LayerNorm(16)  # removes only the mean of fc.bias: not structural
        self.pooler = nn.Linear(16, 16)  # never called: no gradient
        self.mha = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = self.embed(x).transpose(1, 2)
        c = self.bn(self.conv(h))
        s = self.conv_skip(c)
        h = (self.bn_skip(s) + s).transpose(1, 2)
        h = h + self.attention(h)
        h = h + self.mha(h, h, h, need_weights=False)[0]
        return self.head(self.ln(self.fc(h)).mean(1))


EXPECTED = {
    "Net_embed.weight": d.FROZEN,
    "Net_embed.bias": d.FROZEN,
    "Net_conv.bias": d.NORM_FED_BIAS,
    "Net_attention.key.bias": d.ATTENTION_KEY_BIAS,
    "Net_mha.in_proj_bias": d.ATTENTION_KEY_BIAS_SLICE,
    "Net_pooler.weight": d.NO_GRADIENT,
    "Net_pooler.bias": d.NO_GRADIENT,
}
RULES = ["VanishingGradient", "UnchangedTensor", "WeightUpdateRatio", "AllZero", "TensorVariance"]


def rule(name: str, **params: str) -> dict:
    return {"RuleConfigurationName": name, "RuleParameters": {"rule_to_invoke": name, **params}}


def train(path, rules, steps: int = 12):
    torch.manual_seed(0)
    model = Net()
    for p in model.embed.parameters():
        p.requires_grad_(False)
    for m in model.modules():  # BERT's initialisation: biases at zero
        if isinstance(m, nn.Linear | nn.Conv1d) and m.bias is not None:
            nn.init.zeros_(m.bias)
    crit = nn.CrossEntropyLoss()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    g = torch.Generator().manual_seed(1)
    with trainguard.Hook(
        path, rules=rules, save_config=SaveConfig(save_interval=2), stop_check_interval_s=0
    ) as hook:
        hook.register_module(model)
        hook.register_loss(crit)
        model.eval()
        with torch.no_grad():  # an evaluation first: the trace waits for a training forward
            model(torch.randn(4, 8, 4, generator=g))
        model.train()
        for _ in range(steps):
            x, y = torch.randn(16, 8, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
            opt.zero_grad()
            crit(model(x), y).backward()
            opt.step()


def test_the_manifest_names_what_the_model_makes_zero_constant_frozen_or_unused(tmp_path):
    rules = [rule(n) for n in RULES] + [rule("AllZero", tensor_regex=r".*(key|conv)\.bias")]
    rules[-1]["RuleConfigurationName"] = "AllZeroStructural"
    train(tmp_path / "job", rules)
    job = JobView(tmp_path / "job")
    manifest = job.manifest
    assert manifest is not None and manifest.structure is not None
    assert manifest.structure.tensors == EXPECTED
    # zero by construction indeed: VanishingGradient's 1e-7 would fire on both at step 2
    for name in ("gradient/Net_conv.bias", "gradient/Net_attention.key.bias"):
        assert job.stats(name, 2).mean_abs < 1e-7
    assert job.stats("gradient/Net_conv_skip.bias", 2).mean_abs > 1e-4
    result = replay(LocalJob.open(tmp_path / "job"), rules=rules)
    verdicts = {r["RuleConfigurationName"]: r["RuleEvaluationStatus"] for r in result.summary()}
    assert verdicts == {**dict.fromkeys(RULES, "NoIssuesFound"), "AllZeroStructural": "Error"}
    # a rule given only structural tensors checked nothing, and says why
    [structural] = [r for r in result.summary() if r["RuleConfigurationName"] == "AllZeroStructural"]
    assert "by the model's construction" in structural["StatusDetails"]


def test_the_rules_still_catch_a_fault_beside_the_structure(tmp_path):
    """A layer that stops learning (its learning rate 0) is no structure: UnchangedTensor and
    WeightUpdateRatio still fire on it."""
    torch.manual_seed(0)
    model = Net()
    crit = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rules = [rule("UnchangedTensor"), rule("WeightUpdateRatio")]
    g = torch.Generator().manual_seed(1)
    with trainguard.Hook(
        tmp_path / "fault", rules=rules, save_config=SaveConfig(save_interval=2), stop_check_interval_s=0
    ) as hook:
        hook.register_module(model)
        for step in range(30):
            if step == 16:
                opt.param_groups[0]["lr"] = 0.0  # training stops
            x, y = torch.randn(16, 8, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
            opt.zero_grad()
            crit(model(x), y).backward()
            opt.step()
    result = replay(LocalJob.open(tmp_path / "fault"), rules=rules)
    verdicts = {r["RuleConfigurationName"]: r["RuleEvaluationStatus"] for r in result.summary()}
    assert verdicts == {"UnchangedTensor": "IssuesFound", "WeightUpdateRatio": "IssuesFound"}
