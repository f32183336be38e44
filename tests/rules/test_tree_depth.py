"""Golden tests for TreeDepth."""

from __future__ import annotations

from rulejobs import SHORT, config_error, long_run, make, repeat, run, state_bytes, step_data, tensor
from trainguard.rules.tree_depth import depth_of_node


def trees(step: int, max_node: int) -> object:
    nodes = list(range(max_node + 1))
    return step_data(
        step, tensors={"trees/Node": tensor(nodes, ["trees"]), "trees/Tree": tensor([0] * len(nodes))}
    )


def test_depth_of_node() -> None:
    assert [depth_of_node(i) for i in (0, 1, 2, 3, 6, 7, 30, 31)] == [0, 1, 1, 2, 2, 3, 4, 5]


def test_fires_when_trees_grow_deeper_than_depth() -> None:
    out = run(make("TreeDepth"), [trees(0, 14), trees(1, 30), trees(2, 40)])
    assert out.fired_at == 2 and out.finding.value == 5.0 and out.finding.threshold == 4.0


def test_depth_parameter() -> None:
    assert run(make("TreeDepth", depth="6"), [trees(0, 100)]).fired_at is None
    assert run(make("TreeDepth", depth="5"), [trees(0, 100)]).fired_at == 0
    assert make("TreeDepth", depth="8").config.depth == 8
    assert "depth" in config_error("TreeDepth", depth="-1")
    assert run(make("TreeDepth"), [step_data(0, train=1.0)]).fired_at is None


def test_state_bounded() -> None:
    rule = make("TreeDepth")
    state, fired = long_run(rule, repeat(trees(0, 14), SHORT))
    assert fired is None and state.deepest == 3 and state_bytes(rule, state) < 100
