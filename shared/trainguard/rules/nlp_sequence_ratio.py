"""NLPSequenceRatio: some token ids (padding, unknown) take too large a share of the inputs."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, model_validator

from trainguard.format.documents import MAX_VALUE_COUNTS, TensorStats
from trainguard.rules._common import Regex, finite, select, split_list
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt

#: SageMaker's default ``tensor_regex``: MXNet Gluon's name for an embedding block's input
SAGEMAKER_REGEX = ".*embedding0_input_0"
#: trainguard's default selection: the model inputs the hook saves (``model_input_<i>``)
DEFAULT_COLLECTIONS = ("inputs",)
_INTEGER_DTYPES = ("int", "uint")


class NLPSequenceRatioConfig(RuleConfig):
    #: None: integer tensors of the ``inputs`` collection (see the rule's docstring)
    tensor_regex: Regex | None = None
    token_values: Annotated[tuple[int, ...], BeforeValidator(split_list)] = (0,)
    #: SageMaker: 50 (see ``trainguard.rules.catalog.DEPARTURES``)
    token_thresholds_percent: Annotated[tuple[float, ...], BeforeValidator(split_list)] = (70.0,)

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
    tensors_seen: int = 0
    #: (tensor, token) shares judged
    shares_judged: int = 0
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

    Default selection: SageMaker's ``tensor_regex`` default, ``.*embedding0_input_0``, is MXNet
    Gluon's name for an embedding block's input, which no trainguard hook writes (the rule saw
    nothing in any job). trainguard's default (``tensor_regex`` None) is the integer tensors of
    the ``inputs`` collection (``model_input_<i>``: token ids). Given explicitly, SageMaker's
    regex keeps its meaning.
    """

    name = "NLPSequenceRatio"
    Config = NLPSequenceRatioConfig
    State = NLPSequenceRatioState
    summary = "Given token ids (e.g. padding) make up too large a share of the input sequences."
    advice = (
        "Bucket sequences by length or pack them, shorten the maximum sequence length, and "
        "check the tokenizer's unknown-token rate."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        regex = self.config.tensor_regex
        return (
            RuleInput(
                "token-id inputs" if regex is None else f"tensors matching {regex!r}",
                collections=DEFAULT_COLLECTIONS if regex is None else (),
                regex=(regex,) if regex is not None else (),
                statistics=("numel", "values", "value_counts"),
            ),
        )

    def coverage(self, state: NLPSequenceRatioState) -> Coverage:
        reason = ""
        if state.tensors_seen:
            reason = (
                f"{state.tensors_seen:,} input tensors arrived ({state.undecidable:,} token counts "
                "undecidable: no 'values' and a truncated 'value_counts'); integer token ids with 'numel' "
                "are needed"
            )
        return self.covered(
            state.shares_judged, "token shares", "judged", received=[state.tensors_seen], reason=reason
        )

    def update(
        self, state: NLPSequenceRatioState, step: StepData
    ) -> tuple[NLPSequenceRatioState, list[Finding]]:
        cfg = self.config
        regex = (cfg.tensor_regex,) if cfg.tensor_regex is not None else None
        for view, stats in select(step, None, regex, default_collections=DEFAULT_COLLECTIONS):
            if regex is None and not view.record.dtype.lower().startswith(_INTEGER_DTYPES):
                continue  # the default selection: token ids only (float inputs are not tokens)
            state.tensors_seen += 1
            if not stats.numel:
                continue
            state.tensors_checked += 1
            for i, token in enumerate(cfg.token_values):
                count = token_count(stats, token)
                if count is None:
                    state.undecidable += 1
                    continue
                state.shares_judged += 1
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
