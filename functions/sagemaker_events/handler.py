"""sagemaker_events: trainguard's status events → SageMaker-shaped ``Training Job State Change`` events."""

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext
from trainguard.service.sagemaker_events import handle_event

logger = Logger(service="trainguard-sagemaker-events")


@logger.inject_lambda_context
def handler(event: dict, context: LambdaContext) -> dict:
    return handle_event(event)
