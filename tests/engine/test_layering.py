"""``trainguard.engine`` is pure evaluation: no AWS SDK, no DynamoDB or S3 code, no service import.

The AWS adapters (state table, S3 reads, EventBridge, the job pipeline) live in
``trainguard.service``; the engine only sees the interfaces they implement.
"""

from __future__ import annotations

import ast
from pathlib import Path

import trainguard.engine

ENGINE = Path(trainguard.engine.__file__).parent
FORBIDDEN = ("boto3", "botocore", "moto", "aws_lambda_powertools", "trainguard.service")


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_engine_imports_no_aws_adapter():
    modules = sorted(ENGINE.glob("*.py"))
    assert {p.stem for p in modules} >= {"evaluator", "model", "replay", "sources"}
    for path in modules:
        bad = sorted(n for n in imports(path) if n.startswith(FORBIDDEN))
        assert not bad, f"{path.name} imports {bad}: AWS adapters belong in trainguard.service"


def test_the_aws_adapters_are_in_the_service_package():
    from trainguard.service import pipeline, publisher, s3_objects, state_store

    assert pipeline.JobPipeline and publisher.Publisher and s3_objects.S3Job and state_store.StateStore
    assert not (ENGINE / "store.py").exists() and not (ENGINE / "service.py").exists()
