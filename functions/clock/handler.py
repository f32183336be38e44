"""clock: a scheduled tick (every minute) for rules that fire on missing data, and silent jobs."""

from aws_lambda_powertools.utilities.typing import LambdaContext
from trainguard.service.evaluate import deadline_of, service
from trainguard.service.logs import function_logger

logger = function_logger("clock")


@logger.inject_lambda_context
def handler(event: dict, context: LambdaContext) -> dict:
    results = service().tick(deadline_of(context))
    failed = [{"job": r.job, "error": r.error} for r in results if r.error is not None]
    return {
        "jobs": len(results),
        "transitions": sum(r.transitions for r in results),
        "failed": failed,
        "unfinished": sum(1 for r in results if r.unfinished),
    }
