#!/usr/bin/env python3
"""CDK entry point: ``npx cdk synth`` (via cdk.json) or ``.venv/bin/python infra/app.py``.

The app applies cdk.json's context (feature flags) itself, so tests and a direct run
synthesize the same template as the CDK CLI, and registers cdk-nag's AwsSolutions checks:
an unacknowledged finding fails synth.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python infra/app.py` puts infra/ first, not the repo root
    sys.path.insert(0, str(REPO))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk import App, Validations  # noqa: E402
from cdk_nag import AwsSolutionsChecks  # noqa: E402

from infra.config import StackConfig  # noqa: E402
from infra.stack import TrainguardStack  # noqa: E402

DEFAULT_STACK_NAME = "Trainguard"


def cdk_json_context() -> dict[str, Any]:
    path = REPO / "cdk.json"
    return dict(json.loads(path.read_text()).get("context", {})) if path.exists() else {}


def build_app(
    context: dict[str, Any] | None = None,
    *,
    outdir: str | None = None,
    nag: bool | None = None,
    config_dir: Path = REPO,
) -> tuple[App, TrainguardStack]:
    """The app and its one stack. CLI context (CDK_CONTEXT_JSON) overrides ``context``.

    ``config_dir`` holds the optional ``trainguard.config.json`` (tests point it elsewhere).
    """
    if outdir is None and not os.environ.get("CDK_OUTDIR"):
        outdir = str(REPO / "cdk.out")
    app = App(context={**cdk_json_context(), **(context or {})}, outdir=outdir)
    config = StackConfig.load(app.node.try_get_context, config_dir)
    stack = TrainguardStack(
        app,
        str(app.node.try_get_context("stackName") or DEFAULT_STACK_NAME),
        config=config,
        description="trainguard: incremental training-rule evaluation, alerts and stop actions",
    )
    if nag is None:
        nag = str(app.node.try_get_context("nag")).lower() != "false"
    if nag:
        Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack


def main() -> None:
    app, _ = build_app()
    app.synth()


if __name__ == "__main__":
    main()
