"""Golden tests for NLPSequenceRatio."""

from __future__ import annotations

import numpy as np
from rulejobs import SHORT, config_error, long_run, make, repeat, run, state_bytes, step_data, tensor
from trainguard.format.documents import MAX_VALUE_COUNTS
from trainguard.rules.nlp_sequence_ratio import token_count

NAME = "embedding0_input_0"


def tokens(step: int, pad: int, total: int = 100, *, counts_only: bool = False) -> object:
    ids = np.array([0] * pad + [7] * (total - pad)).reshape(4, -1)
    extra = (
        {"value_counts": {"0": pad, "7": total - pad}}
        if counts_only
        else {"values": ids.ravel().astype(float).tolist()}
    )
    return step_data(step, tensors={NAME: tensor(ids, ["inputs"], dtype="int64", **extra)})


def test_padding_share_fires() -> None:
    steps = [tokens(0, 20), tokens(1, 64), tokens(2, 72)]
    out = run(make("NLPSequenceRatio"), steps)
    assert out.fired_at == 2 and out.finding.value == 72.0 and out.finding.threshold == 70.0
    # SageMaker's documented default, given explicitly, keeps its meaning
    sagemaker = run(make("NLPSequenceRatio", token_thresholds_percent="50"), steps)
    assert sagemaker.fired_at == 1 and sagemaker.finding.threshold == 50.0


def test_value_counts_are_enough() -> None:
    assert run(make("NLPSequenceRatio"), [tokens(0, 72, counts_only=True)]).fired_at == 0


def test_several_tokens_and_thresholds() -> None:
    rule = make("NLPSequenceRatio", token_values="0,7", token_thresholds_percent="90,30")
    assert rule.config.token_values == (0, 7) and rule.config.token_thresholds_percent == (90.0, 30.0)
    out = run(rule, [tokens(0, 60)])
    assert out.fired_at == 0 and "token 7" in out.finding.message


def test_token_count_sources() -> None:
    from rulejobs import stats_of

    full = {str(i): 1 for i in range(MAX_VALUE_COUNTS)}
    assert token_count(stats_of([1, 2], value_counts={"1": 1, "2": 1}), 5) == 0  # complete counts
    assert token_count(stats_of([1, 2], value_counts=full), 999) is None  # truncated: unknown
    assert token_count(stats_of([1, 2]), 1) is None


def test_parameters() -> None:
    assert "token_thresholds_percent" in config_error(
        "NLPSequenceRatio", token_values="0,1,2", token_thresholds_percent="10,20"
    )
    assert "token_values" in config_error("NLPSequenceRatio", token_values="pad")
    assert "between 0 and 100" in config_error("NLPSequenceRatio", token_thresholds_percent="150")


def test_state_bounded() -> None:
    rule = make("NLPSequenceRatio")
    state, fired = long_run(rule, repeat(tokens(0, 10), SHORT))
    assert fired is None and state_bytes(rule, state) < 200
