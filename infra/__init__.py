"""The trainguard CDK app: one stack built from ``trainguard.wiring.WIRING`` (see docs/deploy.md)."""
