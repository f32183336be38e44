"""notify: rule-status events (EventBridge) → one SNS email/SMS per transition."""

from aws_lambda_powertools.utilities.typing import LambdaContext
from trainguard.service.logs import function_logger
from trainguard.service.notify import handle_event

logger = function_logger("notify")


@logger.inject_lambda_context
def handler(event: dict, context: LambdaContext) -> dict:
    return handle_event(event, context)
