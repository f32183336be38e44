"""Structure is not a fault: tensors zero, constant, frozen or unused by the model's build
(the manifest's ``structure``) are left out of the rules that would misread them, and those
rules still catch their faults on every other tensor."""

from __future__ import annotations

import dataclasses

import numpy as np
from rulejobs import make, run, step_data, tensor
from trainguard.engine.evaluator import apply_manifest
from trainguard.engine.model import JobState
from trainguard.format import documents as d
from trainguard.rules._structure import NOT_CHANGING, parameter_name, structural

NOW = 1_700_000_000.0
BN_BIAS = "Net_conv.bias"  # a conv bias feeding BatchNorm: zero gradient by construction
KEY_BIAS = "Net_attn.key.bias"
FROZEN = "Net_embed.weight"
STRUCTURE = {BN_BIAS: d.NORM_FED_BIAS, KEY_BIAS: d.ATTENTION_KEY_BIAS, FROZEN: d.FROZEN}


def with_structure(steps, structure=STRUCTURE):
    return [dataclasses.replace(s, structure=structure) for s in steps]


def test_a_gradient_shares_its_parameters_entry():
    assert parameter_name(f"gradient/{BN_BIAS}") == BN_BIAS
    assert structural(STRUCTURE, f"gradient/{KEY_BIAS}", NOT_CHANGING) == d.ATTENTION_KEY_BIAS
    assert structural(STRUCTURE, "gradient/Net_fc.weight", NOT_CHANGING) is None
    assert structural({}, f"gradient/{BN_BIAS}", NOT_CHANGING) is None


def gradients(vanish_at: int | None = None, steps: int = 5):
    """Zero-by-construction gradients every step; ``Net_fc.weight``'s vanishes at ``vanish_at``."""
    out = []
    for s in range(steps):
        fc = 1e-9 if vanish_at is not None and s >= vanish_at else 1e-2
        out.append(
            step_data(
                s,
                tensors={
                    f"gradient/{BN_BIAS}": tensor(np.full(8, 3e-10), ["gradients"]),
                    f"gradient/{KEY_BIAS}": tensor(np.zeros(8), ["gradients"]),
                    "gradient/Net_fc.weight": tensor(np.full((4, 4), fc), ["gradients"]),
                },
            )
        )
    return out


def test_vanishing_gradient_leaves_out_zero_by_construction_and_still_catches_a_vanished_one():
    assert run(make("VanishingGradient"), gradients()).fired_at == 0  # without the structure: step 0
    out = run(make("VanishingGradient"), with_structure(gradients()))
    assert out.fired_at is None and out.state.structural == 10 and out.state.tensors_checked == 5
    out = run(make("VanishingGradient"), with_structure(gradients(vanish_at=3)))
    assert out.fired_at == 3 and out.finding.tensor == "gradient/Net_fc.weight"


def test_a_rule_that_saw_only_structure_ends_error_with_the_reason():
    only = [
        dataclasses.replace(s, structure=STRUCTURE)
        for s in (
            step_data(i, tensors={f"gradient/{BN_BIAS}": tensor(np.zeros(8), ["gradients"])})
            for i in range(3)
        )
    ]
    rule = make("VanishingGradient")
    out = run(rule, only)
    coverage = rule.coverage(out.state)
    assert out.fired_at is None and not coverage.complete
    assert "constant, frozen or unused by the model's construction" in coverage.starved(rule.name, 3)


def params(frozen_moves: bool = False, fc_stops_at: int | None = None, steps: int = 6):
    out = []
    for s in range(steps):
        fc = 1.0 + (0.1 * s if fc_stops_at is None or s < fc_stops_at else 0.1 * fc_stops_at)
        out.append(
            step_data(
                s,
                tensors={
                    FROZEN: tensor(np.full((4, 4), 0.5 + (0.1 * s if frozen_moves else 0)), ["weights"]),
                    BN_BIAS: tensor(np.full(8, 0.2), ["biases"]),
                    KEY_BIAS: tensor(np.zeros(8), ["biases"]),
                    "Net_fc.weight": tensor(
                        np.full((4, 4), fc) * np.arange(1, 17).reshape(4, 4), ["weights"]
                    ),
                },
            )
        )
    return out


def test_unchanged_tensor_leaves_out_frozen_and_constant_parameters_and_still_catches_a_stalled_one():
    assert run(make("UnchangedTensor"), params()).fired_at == 2  # the frozen embedding, unexcused
    out = run(make("UnchangedTensor"), with_structure(params()))
    assert out.fired_at is None and out.state.structural == 18
    out = run(make("UnchangedTensor"), with_structure(params(fc_stops_at=2)))
    assert out.fired_at == 4 and out.finding.tensor == "Net_fc.weight"


def test_all_zero_leaves_out_a_zero_key_bias_but_judges_a_frozen_weight():
    """A zero-initialised key bias stays zero by construction; a frozen weight that is all
    zero is a bad checkpoint load, which AllZero names."""
    assert run(make("AllZero", collection_names="biases"), params()).fired_at == 0
    assert run(make("AllZero", collection_names="biases"), with_structure(params())).fired_at is None
    zero = [
        dataclasses.replace(s, structure=STRUCTURE)
        for s in (step_data(i, tensors={FROZEN: tensor(np.zeros((4, 4)), ["weights"])}) for i in range(2))
    ]
    assert run(make("AllZero"), zero).fired_at == 0


def test_tensor_variance_leaves_out_a_constant_by_construction_bias_even_when_selected():
    rule = {"collection_names": "biases", "min_threshold": "1e-6"}
    assert run(make("TensorVariance", **rule), params()).fired_at == 0
    out = run(make("TensorVariance", **rule), with_structure(params()))
    assert out.fired_at is None and out.state.structural == 12


def manifest(structure: dict[str, str] | None) -> d.Manifest:
    return d.Manifest(
        job="job",
        created=NOW,
        hook_version="t",
        world_size=1,
        structure=None if structure is None else d.ModelStructure(tensors=structure),
    )


def test_old_manifests_stay_valid_and_a_rewritten_manifest_adds_structure():
    old = d.Manifest.model_validate_json(
        b'{"job": "job", "created": 1.0, "hook_version": "0", "world_size": 1}'
    )
    assert old.structure is None
    state = apply_manifest(JobState(job="job"), manifest({BN_BIAS: d.NORM_FED_BIAS}), NOW).state
    assert state.info is not None and state.info.structure == {BN_BIAS: d.NORM_FED_BIAS}
    # the hook learnt of an unused parameter after the first backward: its rewrite adds it
    grown = apply_manifest(state, manifest({BN_BIAS: d.FROZEN, "Net_pooler.weight": d.NO_GRADIENT}), NOW)
    assert grown.changed and grown.state.info is not None
    assert grown.state.info.structure == {BN_BIAS: d.NORM_FED_BIAS, "Net_pooler.weight": d.NO_GRADIENT}
    assert [r.name for r in grown.state.rules] == [r.name for r in state.rules]  # the rules stay
    # an older (shorter) copy read late changes nothing
    assert not apply_manifest(grown.state, manifest({BN_BIAS: d.NORM_FED_BIAS}), NOW).changed
    assert not apply_manifest(grown.state, manifest(None), NOW).changed
