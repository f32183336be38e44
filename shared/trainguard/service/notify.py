"""The notify function's logic: one SNS publish per status transition, never one per step.

The evaluate function emits each transition once (its conditional write is the gate);
the rare repeat (a crash between PutEvents and the outbox delete, or EventBridge's own
at-least-once delivery) is dropped here by Powertools idempotency on the event's
``EventId``, stored in the state table.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from trainguard.engine.events import RuleStatusDetail
from trainguard.service.alerts import render
from trainguard.service.clients import client
from trainguard.service.settings import Settings
from trainguard.wiring import TABLE, idempotency_partition

ALERT_CHANNELS = ("Email", "SMS")
FUNCTION_ID = "notify"


def publish(detail: RuleStatusDetail) -> dict[str, Any]:
    settings = Settings.from_env()
    channels = [a for a in detail.Actions if a in ALERT_CHANNELS]
    if not channels or settings.topic_arn is None:
        return {"published": False, "reason": "no Email/SMS action or no topic"}
    alert = render(detail)
    resp = client("sns").publish(
        TopicArn=settings.topic_arn,
        Subject=alert.subject,
        MessageStructure="json",
        Message=json.dumps({"default": alert.email, "email": alert.email, "sms": alert.sms}),
        # subscriptions filter on this: email ones take "Email", SMS ones take "SMS"
        MessageAttributes={"actions": {"DataType": "String.Array", "StringValue": json.dumps(channels)}},
    )
    return {"published": True, "message_id": resp["MessageId"], "event_id": detail.EventId}


@lru_cache(maxsize=1)
def _once() -> tuple[Callable[..., dict[str, Any]], Any]:
    from aws_lambda_powertools.utilities.idempotency import (
        DynamoDBPersistenceLayer,
        IdempotencyConfig,
        idempotent_function,
    )

    settings = Settings.from_env()
    store = DynamoDBPersistenceLayer(
        table_name=settings.table_name,
        key_attr=TABLE.partition_key,
        sort_key_attr=TABLE.sort_key,
        expiry_attr=TABLE.ttl_attribute,
        # the one partition the notify role may touch (dynamodb:LeadingKeys in trainguard.wiring)
        static_pk_value=idempotency_partition(FUNCTION_ID),
        boto3_client=client("dynamodb"),
    )
    config = IdempotencyConfig(event_key_jmespath="EventId", expires_after_seconds=7 * 24 * 3600)

    @idempotent_function(data_keyword_argument="detail", persistence_store=store, config=config)  # type: ignore[untyped-decorator]
    def publish_once(detail: dict[str, Any]) -> dict[str, Any]:
        return publish(RuleStatusDetail.model_validate(detail))

    return publish_once, config


def handle_event(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    detail = RuleStatusDetail.model_validate(event["detail"])
    publish_once, config = _once()
    if context is not None:
        config.register_lambda_context(context)  # an in-progress record expires with the invocation
    return publish_once(detail=detail.model_dump(mode="json"))
