"""report: when a job's evaluation finishes, write its profiler report next to its data."""

from aws_lambda_powertools.utilities.typing import LambdaContext
from trainguard.service.logs import function_logger
from trainguard.service.report import handle_event

logger = function_logger("report")


@logger.inject_lambda_context
def handler(event: dict, context: LambdaContext) -> dict:
    return handle_event(event)
