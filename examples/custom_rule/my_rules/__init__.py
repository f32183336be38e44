"""Custom trainguard rules. trainguard loads exactly the classes listed in ``RULES``."""

from my_rules.loss_spike import LossSpike

RULES = [LossSpike]

__all__ = ["RULES", "LossSpike"]
