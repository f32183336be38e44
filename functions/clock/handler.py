"""clock: a scheduled tick (every minute) for rules that fire on missing data."""

from aws_lambda_powertools.utilities.typing import LambdaContext
from trainguard.service.evaluate import service
from trainguard.service.logs import function_logger

logger = function_logger("clock")


@logger.inject_lambda_context
def handler(event: dict, context: LambdaContext) -> dict:
    results = service().tick()
    return {"jobs": len(results), "transitions": sum(r.transitions for r in results)}
