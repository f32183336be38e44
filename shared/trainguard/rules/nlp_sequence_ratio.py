"""NLPSequenceRatio: some token ids (padding, unknown) take too large a share of the inputs."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, model_validator

from trainguard.format.documents import MAX_VALUE_COUNTS, TensorStats
from trainguard.rules._common import Regex, finite, split_list
from trainguard.rules.base import Finding, Rule, RuleConfig, RuleState, StepData, fmt


class NLPSequenceRatioConfig(RuleConfig):
    tensor_regex: Regex = ".*embedding0_input_0"
    token_values: Annotated[tuple[int, ...], BeforeValidator(split_list)] = (0,)
    token_thresholds_percent: Annotated[tuple[float, ...], BeforeValidator(split_list)] = (50.0,)

    @model_validator(mode="after")
    def _paired(self) -> NLPSequenceRatioConfig:
        if len(self.token_thresholds_percent) not in (1, len(self.token_values)):
            raise ValueError("token_thresholds_percent needs one value, or one per token in token_values")
        if not all(finite(t) and 0 <= t <= 100 for t in self.token_thresholds_percent):
            raise ValueError("token_thresholds_percent values must be between 0 and 100")
        return self

    def threshold(self, index: int) -> float:
        t = self.token_thresholds_percent
        return t[0] if len(t) == 1 else t[index]


class NLPSequenceRatioState(RuleState):
    tensors_checked: int = 0
    #: tensors that carried neither ``values`` nor a usable ``value_counts``
    undecidable: int = 0


def token_count(stats: TensorStats, token: int) -> int | None:
    """How many elements equal ``token``; None when the statistics cannot tell."""
    if stats.values is not None:
        return sum(1 for v in stats.values if v == token)
    counts = stats.value_counts
    if counts is None:
        return None
    if str(token) in counts:
        return counts[str(token)]
    if len(counts) < MAX_VALUE_COUNTS:
        return 0  # the counts are complete
    return None


class NLPSequenceRatio(Rule[NLPSequenceRatioConfig, NLPSequenceRatioState]):
    """Fires when the share of a token id from ``token_values`` among a step's input tokens is
    > its ``token_thresholds_percent`` (one threshold, or one per token).

    Reads tensors matching ``tensor_regex`` (token ids fed to the embedding), per step,
    worker and mode: the ``values`` statistic when the hook sent the tensor whole, else
    ``value_counts`` (the hook's counts of the most frequent values; when it is truncated a
    token missing from it cannot be judged, and when a token is present its share is exact).
    """

    name = "NLPSequenceRatio"
    Config = NLPSequenceRatioConfig
    State = NLPSequenceRatioState
    summary = "Given token ids (e.g. padding) make up too large a share of the input sequences."
    advice = (
        "Bucket sequences by length or pack them, shorten the maximum sequence length, and "
        "check the tokenizer's unknown-token rate."
    )

    def update(
        self, state: NLPSequenceRatioState, step: StepData
    ) -> tuple[NLPSequenceRatioState, list[Finding]]:
        cfg = self.config
        for view in step.tensors(regex=cfg.tensor_regex):
            stats = view.stats
            if stats is None or stats.numel == 0:
                continue
            state.tensors_checked += 1
            for i, token in enumerate(cfg.token_values):
                count = token_count(stats, token)
                if count is None:
                    state.undecidable += 1
                    continue
                share = 100.0 * count / stats.numel
                threshold = cfg.threshold(i)
                if share > threshold:
                    return state, [
                        self.finding(
                            step.step,
                            f"{self.name}: token {token} is {fmt(share)}% of the {stats.numel} tokens "
                            f"of {view.name} "
                            f"(worker {view.worker}, {view.mode}) > "
                            f"token_thresholds_percent={fmt(threshold)}.",
                            tensor=view.name,
                            value=share,
                            threshold=threshold,
                        )
                    ]
        return state, []
