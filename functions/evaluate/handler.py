"""evaluate: S3 notifications (via SQS) → rule evaluation. Logic: trainguard.service.evaluate.

Powertools' BatchProcessor ingests each record (partial batch failure per record); then
each job touched by the batch is advanced once, and a job that fails to advance fails
its records so SQS redelivers them.
"""

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext
from trainguard.service.evaluate import advance_jobs, ingest_record
from trainguard.service.logs import function_logger

logger = function_logger("evaluate")
processor = BatchProcessor(event_type=EventType.SQS)


@logger.inject_lambda_context
def handler(event: dict, context: LambdaContext) -> dict:
    touched: dict[str, list[str]] = {}

    def record_handler(record: SQSRecord) -> None:
        for job in ingest_record(record.body, record.message_id):
            touched.setdefault(job, []).append(record.message_id)

    with processor(records=event["Records"], handler=record_handler, lambda_context=context):
        processor.process()
    response = processor.response()
    failures = response["batchItemFailures"]
    failed = {f["itemIdentifier"] for f in failures}
    failures += [{"itemIdentifier": m} for m in advance_jobs(touched) if m not in failed]
    return response
