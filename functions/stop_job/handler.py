"""stop_job: IssuesFound events with the StopTraining action → stop the job."""

from aws_lambda_powertools.utilities.typing import LambdaContext
from trainguard.service.logs import function_logger
from trainguard.service.stop_job import handle_event

logger = function_logger("stop_job")


@logger.inject_lambda_context
def handler(event: dict, context: LambdaContext) -> dict:
    return handle_event(event)
