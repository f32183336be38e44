"""TreeDepth (XGBoost): the trees grow deeper than ``depth``."""

from __future__ import annotations

import math
import re

from pydantic import Field

from trainguard.rules._common import finite
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt

#: smdebug's XGBoost hook saves ``trees_to_dataframe()`` columns as ``trees/<column>``
NODE_REGEX = r"(.*/)?trees/Node$"
NODE_TENSOR = re.compile(NODE_REGEX)


class TreeDepthConfig(RuleConfig):
    depth: int = Field(default=4, ge=0)


class TreeDepthState(RuleState):
    deepest: int | None = None
    #: steps whose node ids were judged
    steps_judged: int = 0


def depth_of_node(node_id: int) -> int:
    """Depth of a node numbered breadth-first from root 0 (children 2i+1, 2i+2)."""
    return math.floor(math.log2(node_id + 1))


class TreeDepth(Rule[TreeDepthConfig, TreeDepthState]):
    """Fires when the depth of the trees, derived from the largest node id, exceeds ``depth``.

    Reads the node-id tensor of the ``trees`` collection (``trees/Node``; its ``max``
    statistic, or a scalar of that name), every worker and mode.

    Choice: SageMaker documents "the base-2 logarithm of the largest node id"; taken
    literally that calls a complete depth-4 tree (ids 0-30, log2(30) = 4.9) deeper than 4, so
    the depth here is ``floor(log2(max_id + 1))``, exact for breadth-first numbering. XGBoost
    numbers nodes as it grows them, so for sparse trees either formula is an estimate.
    """

    name = "TreeDepth"
    Config = TreeDepthConfig
    State = TreeDepthState
    summary = "XGBoost trees are deeper than depth."
    advice = "Lower max_depth, raise min_child_weight or gamma, or add regularisation (lambda, alpha)."

    def reads(self) -> tuple[RuleInput, ...]:
        return (
            RuleInput(
                "XGBoost tree node ids",
                collections=("trees",),
                regex=(NODE_REGEX,),
                statistics=("numel", "max"),
            ),
            RuleInput("XGBoost tree node ids", regex=(NODE_REGEX,), scalars=True, required=False),
        )

    def coverage(self, state: TreeDepthState) -> Coverage:
        return self.covered(state.steps_judged, "steps of tree node ids", received=[state.steps_judged] * 2)

    def update(self, state: TreeDepthState, step: StepData) -> tuple[TreeDepthState, list[Finding]]:
        ids: list[tuple[str, float]] = [
            (v.name, v.stats.max)
            for v in step.tensors()
            if NODE_TENSOR.match(v.name) and v.stats is not None and v.stats.numel and v.stats.max is not None
        ]
        ids += [(name, sc.value) for _, name, _, sc in step.scalars() if NODE_TENSOR.match(name)]
        ids = [(n, v) for n, v in ids if finite(v) and v >= 0]
        if not ids:
            return state, []
        state.steps_judged += 1
        name, largest = max(ids, key=lambda x: x[1])
        deepest = depth_of_node(int(largest))
        state.deepest = max(deepest, state.deepest or 0)
        if deepest > self.config.depth:
            return state, [
                self.finding(
                    step.step,
                    f"{self.name}: largest node id {fmt(largest)} in {name} means depth {deepest} > "
                    f"depth={self.config.depth}.",
                    tensor=name,
                    value=float(deepest),
                    threshold=float(self.config.depth),
                )
            ]
        return state, []
