"""Structure is not a fault: which saved tensors a rule leaves out because of the model's build.

The PyTorch hook records, in the manifest's ``structure``, parameters that are zero or
constant by construction (a bias feeding a normalisation layer, an attention key bias),
frozen, or given no gradient (``trainguard.format.documents.ModelStructure``); the engine
passes it to every rule as ``StepData.structure``. A gradient ``gradient/<name>`` shares its
parameter's entry.

Each rule names the kinds it leaves out. Zero or constant by construction misleads every
rule that reads gradients, updates or values. Frozen and unused parameters are left out of
the rules about change (their weights stay put by design), but not of AllZero and
TensorVariance: a frozen weight that is all zero or collapsed is a bad checkpoint load.

Not a rule module (it defines no ``Rule`` subclass), so the registry guard ignores it.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainguard.format.documents import ATTENTION_KEY_BIAS, FROZEN, NO_GRADIENT, NORM_FED_BIAS

#: zero or constant by construction: gradients ~0, updates ~0, values stay at their start
BY_CONSTRUCTION: frozenset[str] = frozenset({NORM_FED_BIAS, ATTENTION_KEY_BIAS})
#: ...and parameters that do not change by the user's design (frozen, unused)
NOT_CHANGING: frozenset[str] = BY_CONSTRUCTION | {FROZEN, NO_GRADIENT}

GRADIENT_PREFIX = "gradient/"


def parameter_name(tensor: str) -> str:
    """The parameter a saved tensor stands for (a gradient's name without ``gradient/``)."""
    return tensor.removeprefix(GRADIENT_PREFIX)


def structural(structure: Mapping[str, str], tensor: str, kinds: frozenset[str]) -> str | None:
    """The kind of ``tensor`` when it is one of ``kinds`` (None: the rule judges it)."""
    if not structure:
        return None
    kind = structure.get(parameter_name(tensor))
    return kind if kind in kinds else None


def structural_reason(skipped: int, noun: str) -> str:
    """The coverage reason when every tensor that arrived was left out as structure."""
    return (
        f"{skipped:,} {noun} arrived, every one zero, constant, frozen or unused by the model's "
        "construction (the manifest's structure), which this rule does not judge"
    )
