"""Regexes from job configurations run in bounded time, with re.match semantics (issue 9, item 3)."""

from __future__ import annotations

import pytest
from rulejobs import config_error, make, run, step_data, tensor
from test_coverage import evaluate
from trainguard.rules import regex as bounded
from trainguard.rules.regex import RegexError, compile_bounded

CATASTROPHIC = "(a+)+$"
NAME = "a" * 61 + "!"  # exponential under Python's re: it never returns


@pytest.mark.timeout(60)
def test_a_catastrophic_pattern_returns_promptly_in_every_rule_that_takes_a_regex() -> None:
    steps = [step_data(s, tensors={NAME: tensor([[1.0, 2.0]], ["weights"])}) for s in range(3)]
    for name, param in (
        ("ExplodingTensor", "tensor_regex"),
        ("AllZero", "tensor_regex"),
        ("DeadRelu", "tensor_regex"),
        ("SaturatedActivation", "tensor_regex"),
        ("LossNotDecreasing", "tensor_regex"),
        ("ClassImbalance", "labels_regex"),
        ("CheckInputImages", "regex"),
        ("PoorWeightInitialization", "activation_inputs_regex"),
    ):
        out = run(make(name, **{param: CATASTROPHIC}), steps)
        assert out.fired_at is None, name  # no match, and no hang


@pytest.mark.timeout(60)
def test_the_evaluator_judges_a_job_whose_regex_would_backtrack() -> None:
    steps = [step_data(s, tensors={NAME: tensor([[1.0, 0.0]], ["weights"])}) for s in range(3)]
    record = evaluate("ExplodingTensor", steps, {"tensor_regex": CATASTROPHIC})
    assert record.status == "Error" and "saw no tensors matching '(a+)+$'" in record.details
    assert evaluate("AllZero", steps, {"tensor_regex": "a+!"}).status == "NoIssuesFound"


def test_what_the_bounded_engine_cannot_run_is_a_configuration_error() -> None:
    error = config_error("ExplodingTensor", tensor_regex=r"(\w+)/\1")
    assert "backreference" in error and "bounded-time regex engine" in error
    assert "lookahead" in config_error("AllZero", tensor_regex="fc(?!1)")
    assert "at most 1024" in config_error("DeadRelu", tensor_regex="x" * 2000)
    assert "invalid regular expression" in config_error("DeadRelu", tensor_regex="(")


def test_one_rule_s_bad_regex_does_not_touch_the_others() -> None:
    from trainguard.rules.config import parse_rule_configurations

    entries = [
        {
            "RuleConfigurationName": "bad",
            "RuleParameters": {"rule_to_invoke": "AllZero", "tensor_regex": "a(?=b)"},
        },
        {"RuleConfigurationName": "good", "RuleParameters": {"rule_to_invoke": "AllZero"}},
    ]
    bad, good = parse_rule_configurations(entries)
    assert bad.rule is None and bad.error is not None and "lookahead" in bad.error
    assert good.rule is not None and good.error is None


def test_re_match_semantics_are_kept() -> None:
    assert compile_bounded(".*relu_output").match("fc1/relu_output") is not None
    assert compile_bounded("relu_output").match("fc1/relu_output") is None  # anchored at the start
    assert compile_bounded("fc1").match("fc1/relu_output") is not None  # not at the end
    assert compile_bounded(r"(?P<layer>fc\d+)\.weight").match("fc12.weight") is not None
    assert compile_bounded("(?i)GRADIENT/.*").match("gradient/x") is not None


def test_without_re2_only_patterns_that_cannot_backtrack_are_accepted(monkeypatch) -> None:
    monkeypatch.setattr(bounded, "_re2", None)
    compile_bounded.cache_clear()
    try:
        assert compile_bounded(".*tanh_input|.*sigmoid_input").match("fc/tanh_input") is not None
        assert compile_bounded("(fc[0-9]+)/weight").match("fc1/weight") is not None
        for bad in (CATASTROPHIC, "(a|aa)*b", r"(x)\1"):
            with pytest.raises(RegexError, match="google-re2"):
                compile_bounded(bad)
    finally:
        compile_bounded.cache_clear()
