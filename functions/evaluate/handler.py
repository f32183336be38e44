"""evaluate: S3 notifications (via SQS) → rule evaluation. Logic: trainguard.service.evaluate.

Powertools' BatchProcessor ingests each record (partial batch failure per record); then
each job touched by the batch is advanced once, within its time budget, and a job that
fails to advance fails only its own records so SQS redelivers them.
"""

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext
from trainguard.service.evaluate import Batch, deadline_of
from trainguard.service.logs import function_logger

logger = function_logger("evaluate")
processor = BatchProcessor(event_type=EventType.SQS)


@logger.inject_lambda_context
def handler(event: dict, context: LambdaContext) -> dict:
    batch = Batch(deadline_of(context))

    def record_handler(record: SQSRecord) -> None:
        receive_count = int(record.attributes.approximate_receive_count or 1)
        batch.ingest(record.body, record.message_id, receive_count)

    with processor(records=event["Records"], handler=record_handler, lambda_context=context):
        processor.process()
    response = processor.response()
    failures = response["batchItemFailures"]
    failed = {f["itemIdentifier"] for f in failures}
    failures += [{"itemIdentifier": m} for m in batch.advance() if m not in failed]
    return response
