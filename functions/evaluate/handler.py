"""evaluate: S3 notifications (via SQS) → rule evaluation. Logic: trainguard.service.evaluate."""

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from trainguard.service.evaluate import handle_record

logger = Logger(service="trainguard-evaluate")
processor = BatchProcessor(event_type=EventType.SQS)


def record_handler(record: SQSRecord) -> None:
    handle_record(record.body, record.message_id)


@logger.inject_lambda_context
def handler(event: dict, context: LambdaContext) -> dict:
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
