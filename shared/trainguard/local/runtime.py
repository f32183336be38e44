"""Local mode: the deployed topology on a moto server, with the real handlers.

moto runs no Lambda code and cannot route EventBridge to Lambda or SNS targets, so this
runtime builds the resources that ``trainguard.wiring.WIRING`` describes (the same
description the CDK stack is built from) and does the delivery AWS would do:

- S3 → SQS notifications are moto's own; a poller calls the evaluate handler with an
  SQS-shaped batch and honours its partial-batch response (failed records are retried,
  then moved to the DLQ by SQS's redrive policy, as in AWS);
- each EventBridge rule gets an SQS target queue; a poller hands the event in it to the
  target function's handler, exactly the event a Lambda target would receive.

Each handler runs with the permissions the stack grants its function (``trainguard.local.iam``):
moto authorizes every request against that function's IAM user, and every call is recorded
(``cloud.authority.recorder``) so that tests can check it against the synthesized template.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from trainguard import service
from trainguard.local.iam import LocalAuthority
from trainguard.service import clients, logs
from trainguard.service.settings import Env
from trainguard.wiring import SAGEMAKER_STOP, TABLE, WIRING, BusRuleSpec, Ref, Wiring

logger = logging.getLogger("trainguard.local")

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
DEMO_EMAIL = "ml-team@example.com"
DEMO_PHONE = "+15555550100"
POLL_INTERVAL_S = 0.02
#: local visibility timeout for a failed record before it is retried (AWS: the queue's)
LOCAL_RETRY_DELAY_S = 1


def create_table(ddb: Any, name: str) -> None:
    """The state table as ``trainguard.wiring.TABLE`` describes it."""
    keys = {TABLE.partition_key, TABLE.sort_key} | {
        k for i in TABLE.indexes for k in (i.partition_key, i.sort_key)
    }
    ddb.create_table(
        TableName=name,
        KeySchema=[
            {"AttributeName": TABLE.partition_key, "KeyType": "HASH"},
            {"AttributeName": TABLE.sort_key, "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[{"AttributeName": k, "AttributeType": "S"} for k in sorted(keys)],
        GlobalSecondaryIndexes=[
            {
                "IndexName": index.name,
                "KeySchema": [
                    {"AttributeName": index.partition_key, "KeyType": "HASH"},
                    {"AttributeName": index.sort_key, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
            for index in TABLE.indexes
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    ddb.update_time_to_live(
        TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": TABLE.ttl_attribute}
    )


def repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


@dataclass
class CustomAction:
    """A user's own function attached to the bus: ``path/to/file.py:function``."""

    name: str
    pattern: dict[str, Any]
    handler: str


@dataclass
class Resources:
    endpoint: str
    bucket: str
    table: str
    bus: str
    topic_arn: str
    queues: dict[str, str] = field(default_factory=dict)  # id -> url
    dlqs: dict[str, str] = field(default_factory=dict)  # id -> url
    targets: dict[str, str] = field(default_factory=dict)  # bus-rule id -> target queue url
    #: what trainguard.wiring gives the functions (the handlers share this process's environment)
    function_env: dict[str, str] = field(default_factory=dict)
    #: the operator's keys (the runtime's own calls, and the CLI's)
    access_key: tuple[str, str] = ("testing", "testing")

    def env(self) -> dict[str, str]:
        """Environment of every handler (what the CDK stack sets on each function)."""
        return {
            **self.function_env,
            Env.POWERTOOLS_METRICS_DISABLED: "true",
            Env.POWERTOOLS_TRACE_DISABLED: "true",
        }

    def client_env(self, access_key: tuple[str, str] | None = None) -> dict[str, str]:
        """Environment for a process that talks to this local cloud (operator keys by default;
        a training job: ``LocalCloud.training_env``)."""
        key_id, secret = access_key or self.access_key
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": key_id,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_DEFAULT_REGION": REGION,
            "TRAINGUARD_BUCKET": self.bucket,
        }


class LambdaContext:
    """The context object Lambda passes to a handler (what Powertools reads from it)."""

    def __init__(self, function_name: str, memory_mb: int, timeout_s: int) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = memory_mb
        self.invoked_function_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function_name}"
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def load_handler(path: Path, function: str = "handler") -> Callable[[dict[str, Any], Any], Any]:
    """Import a handler file the way Lambda does (by file, not as part of a package)."""
    name = f"trainguard_fn_{path.parent.name}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load handler {path}")
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, function, None)
    if fn is None:
        raise ImportError(f"{path} has no function {function!r}")
    return fn  # type: ignore[no-any-return]


class LocalCloud:
    """A moto server on 127.0.0.1 with trainguard's resources and delivery loops."""

    def __init__(
        self,
        wiring: Wiring = WIRING,
        name: str = "trainguard-local",
        custom_actions: list[CustomAction] | None = None,
        observe: bool = True,
        clock_speedup: float = 1.0,
        enforce_iam: bool = True,
        sagemaker_stop: bool = False,
    ) -> None:
        self.wiring = wiring
        self.name = name
        self.custom_actions = custom_actions or []
        self.observe = observe
        #: run scheduled functions this many times faster than their rate (demos, tests)
        self.clock_speedup = clock_speedup
        self.server: Any = None
        self.resources: Resources | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._saved_env: dict[str, str | None] = {}
        self.invocations: dict[str, int] = {}
        self.errors: list[str] = []
        #: every event seen on the bus (local observer), in arrival order
        self.events: list[dict[str, Any]] = []
        self.on_event: list[Callable[[dict[str, Any]], None]] = []
        self.on_invoke: list[Callable[[str, dict[str, Any], Any, float], None]] = []
        #: called before a function runs (what it is about to do is said before its effects)
        self.on_begin: list[Callable[[str, dict[str, Any]], None]] = []
        #: moto enforces each function's policy (off: every handler acts as the operator)
        self.enforce_iam = enforce_iam
        self.features = frozenset({SAGEMAKER_STOP} if sagemaker_stop else set())
        self.authority: LocalAuthority | None = None

    # lifecycle --------------------------------------------------------------------------
    def start(self) -> Resources:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        self._set_env(
            {
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": REGION,
                "AWS_SESSION_TOKEN": None,
                "AWS_PROFILE": None,
            }
        )
        service.reset()
        clients.use_endpoint(endpoint)  # the handlers' clients, whenever they are made
        self.resources = self._provision(endpoint)
        self._set_env(self.resources.env())
        if self.enforce_iam:
            self.authority = LocalAuthority(self.wiring, self.arn, self.name, self.features)
            operator = self.authority.start(clients.client("iam"))
            self.resources.access_key = (operator.access_key_id, operator.secret_access_key)
            self._set_env(
                {
                    "AWS_ACCESS_KEY_ID": operator.access_key_id,
                    "AWS_SECRET_ACCESS_KEY": operator.secret_access_key,
                }
            )
            service.reset()
        self._start_pollers()
        return self.resources

    def training_env(self, job: str) -> dict[str, str]:
        """Environment for a training process of ``job``: the training-job policy's identity."""
        assert self.resources is not None
        if self.authority is None:
            return self.resources.client_env()
        creds = self.authority.training_job(job)
        return self.resources.client_env((creds.access_key_id, creds.secret_access_key))

    def arn(self, ref: Ref) -> str:
        """A wiring Ref → the ARN of this local cloud's resource."""
        assert self.resources is not None
        res = self.resources
        arns = {
            "bucket": f"arn:aws:s3:::{res.bucket}",
            "table": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{res.table}",
            "bus": f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/{res.bus}",
            "default-bus": f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/default",
            "alert-topic": res.topic_arn,
            "topic-key": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/none-locally",
            "sagemaker-training-job": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job",
            **{
                f"{qid}-dlq": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{url.rsplit('/', 1)[-1]}"
                for qid, url in res.dlqs.items()
            },
        }
        return arns[ref.resource] + ref.suffix

    def _env_value(self, value: str) -> str:
        assert self.resources is not None
        res = self.resources
        values = {
            "table:name": res.table,
            "bus:name": res.bus,
            "bucket:name": res.bucket,
            "alert-topic:arn": res.topic_arn,
            **{f"{qid}-dlq:url": url for qid, url in res.dlqs.items()},
        }
        return values[value]

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self.authority is not None:
            self.authority.stop()
        if self.server is not None:
            self.server.stop()
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        clients.use_endpoint(None)
        service.reset()

    def __enter__(self) -> LocalCloud:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _set_env(self, values: Mapping[str, str | None]) -> None:
        for key, value in values.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    # provisioning (from the wiring) -----------------------------------------------------
    def _provision(self, endpoint: str) -> Resources:
        s3, sqs, ddb = clients.client("s3"), clients.client("sqs"), clients.client("dynamodb")
        events, sns = clients.client("events"), clients.client("sns")
        res = Resources(
            endpoint=endpoint,
            bucket=f"{self.name}-data",
            table=f"{self.name}-state",
            bus=f"{self.name}-bus",
            topic_arn="",
        )
        s3.create_bucket(Bucket=res.bucket)
        create_table(ddb, res.table)
        for queue in self.wiring.queues:
            dlq_url = sqs.create_queue(QueueName=f"{self.name}-{queue.id}-dlq")["QueueUrl"]
            dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
                "QueueArn"
            ]
            url = sqs.create_queue(
                QueueName=f"{self.name}-{queue.id}",
                Attributes={
                    "VisibilityTimeout": str(queue.visibility_timeout_s),
                    "RedrivePolicy": json.dumps(
                        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": queue.max_receive_count}
                    ),
                },
            )["QueueUrl"]
            res.queues[queue.id], res.dlqs[queue.id] = url, dlq_url
        s3.put_bucket_notification_configuration(
            Bucket=res.bucket,
            NotificationConfiguration={
                "QueueConfigurations": [
                    {
                        "QueueArn": self._queue_arn(res.queues[qid]),
                        "Events": ["s3:ObjectCreated:*"],
                        "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": prefix}]}},
                    }
                    for prefix, qid in self.wiring.notifications
                ]
            },
        )
        events.create_event_bus(Name=res.bus)
        rules = list(self.wiring.bus_rules)
        rules += [
            BusRuleSpec(f"custom-{a.name}", "user action", a.pattern, target=f"custom:{a.name}")
            for a in self.custom_actions
        ]
        if self.observe:
            rules.append(
                BusRuleSpec("observer", "local timeline", {"source": ["trainguard"]}, target="observer")
            )
        for rule in rules:
            url = sqs.create_queue(QueueName=f"{self.name}-target-{rule.id}")["QueueUrl"]
            events.put_rule(
                Name=f"{self.name}-{rule.id}", EventBusName=res.bus, EventPattern=json.dumps(rule.pattern)
            )
            events.put_targets(
                Rule=f"{self.name}-{rule.id}",
                EventBusName=res.bus,
                Targets=[{"Id": "target", "Arn": self._queue_arn(url)}],
            )
            res.targets[rule.id] = url
        res.topic_arn = sns.create_topic(Name=f"{self.name}-alerts")["TopicArn"]
        sns.subscribe(
            TopicArn=res.topic_arn,
            Protocol="email",
            Endpoint=DEMO_EMAIL,
            Attributes={"FilterPolicy": json.dumps({"actions": ["Email"]})},
        )
        sns.subscribe(
            TopicArn=res.topic_arn,
            Protocol="sms",
            Endpoint=DEMO_PHONE,
            Attributes={"FilterPolicy": json.dumps({"actions": ["SMS"]})},
        )
        self.resources = res
        level = os.environ.get(Env.POWERTOOLS_LOG_LEVEL, "WARNING")
        for fn in self.wiring.functions:
            env = self.wiring.environment(fn.id, self._env_value, log_level=level, features=self.features)
            env.pop(Env.POWERTOOLS_SERVICE_NAME)  # one process: each function's logger names it
            res.function_env.update(env)
        return res

    @staticmethod
    def _queue_arn(url: str) -> str:
        arn: str = clients.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        return arn

    # delivery ---------------------------------------------------------------------------
    def _start_pollers(self) -> None:
        assert self.resources is not None
        functions_dir = repo_root() / "functions"
        handlers: dict[str, Callable[[dict[str, Any], Any], Any]] = {}
        for fn in self.wiring.functions:
            module, _, func = fn.handler.rpartition(".")
            handlers[fn.id] = load_handler(functions_dir / fn.id / f"{module}.py", func)
        for action in self.custom_actions:
            path, _, func = action.handler.rpartition(":")
            handlers[f"custom:{action.name}"] = load_handler(Path(path), func or "handler")
        for fn in self.wiring.functions:
            if fn.queue is not None:
                self._spawn(self._poll_sqs_trigger, fn.id, self.resources.queues[fn.queue], handlers[fn.id])
            if fn.schedule_minutes is not None:
                self._spawn(
                    self._schedule, fn.id, fn.schedule_minutes * 60 / self.clock_speedup, handlers[fn.id]
                )
        rules = {r.id: r for r in self.wiring.bus_rules}
        for rule_id, url in self.resources.targets.items():
            if rule_id == "observer":
                self._spawn(self._poll_observer, url)
            else:
                target = rules[rule_id].target if rule_id in rules else f"custom:{rule_id[len('custom-') :]}"
                self._spawn(self._poll_bus_target, target, url, handlers[target])

    def _spawn(self, fn: Callable[..., None], *args: Any) -> None:
        operator = self.authority.credentials(LocalAuthority.OPERATOR) if self.authority else None

        def run() -> None:
            with clients.acting_as(operator):  # the runtime's own calls, whatever the environment
                fn(*args)

        thread = threading.Thread(target=run, daemon=True, name=f"tg-local-{args[0]}")
        thread.start()
        self._threads.append(thread)

    def _receive(self, url: str) -> list[dict[str, Any]]:
        sqs = clients.client("sqs")
        resp = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        return list(resp.get("Messages", []))

    def _invoke(self, fid: str, handler: Callable[[dict[str, Any], Any], Any], event: dict[str, Any]) -> Any:
        spec = next((f for f in self.wiring.functions if f.id == fid), None)
        context = LambdaContext(
            f"{self.name}-{fid}", spec.memory_mb if spec else 128, spec.timeout_s if spec else 30
        )
        started = time.perf_counter()
        self.invocations[fid] = self.invocations.get(fid, 0) + 1
        for begin in self.on_begin:
            begin(fid, event)
        credentials = self.authority.credentials(fid) if self.authority is not None else None
        if spec is not None:
            with clients.acting_as(credentials), logs.running(fid):
                result = handler(event, context)
        else:  # a user's own action: their code, their role (here: the operator)
            result = handler(event, context)
        for callback in self.on_invoke:
            callback(fid, event, result, time.perf_counter() - started)
        return result

    def _poll(self, name: str, url: str, deliver: Callable[[list[dict[str, Any]]], None]) -> None:
        """Receive from ``url`` until stopped and hand each batch to ``deliver``."""
        while not self._stop.is_set():
            try:
                messages = self._receive(url)
                if messages:
                    deliver(messages)
                else:
                    time.sleep(POLL_INTERVAL_S)
            except Exception as exc:  # keep the loop alive; report what happened
                if not self._stop.is_set():
                    self.errors.append(f"poller {name}: {exc}")
                    time.sleep(0.2)

    def _failed(self, fid: str, exc: Exception) -> None:
        self.errors.append(f"{fid}: {type(exc).__name__}: {exc}")
        logger.exception("local %s invocation failed", fid)

    def _retry_later(self, url: str, message: dict[str, Any]) -> None:
        clients.client("sqs").change_message_visibility(
            QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=LOCAL_RETRY_DELAY_S
        )

    def _delete(self, url: str, message: dict[str, Any]) -> None:
        clients.client("sqs").delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])

    def _poll_sqs_trigger(self, fid: str, url: str, handler: Callable[[dict[str, Any], Any], Any]) -> None:
        """An SQS event source mapping: batches, partial batch failure, redelivery after a failure."""
        arn = self._queue_arn(url)

        def deliver(messages: list[dict[str, Any]]) -> None:
            event = {"Records": [_sqs_record(m, arn) for m in messages]}
            try:
                result = self._invoke(fid, handler, event)
                failed = {f["itemIdentifier"] for f in (result or {}).get("batchItemFailures", [])}
            except Exception as exc:  # the whole invocation failed: every record is retried
                self._failed(fid, exc)
                failed = {m["MessageId"] for m in messages}
            for message in messages:
                if message["MessageId"] in failed:
                    self._retry_later(url, message)
                else:
                    self._delete(url, message)

        self._poll(fid, url, deliver)

    def _schedule(self, fid: str, period_s: float, handler: Callable[[dict[str, Any], Any], Any]) -> None:
        """EventBridge Scheduler's rate rule: the same event shape, every ``period_s``."""
        while not self._stop.wait(period_s):
            event = {
                "version": "0",
                "id": str(uuid.uuid4()),
                "detail-type": "Scheduled Event",
                "source": "aws.events",
                "account": ACCOUNT,
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "region": REGION,
                "resources": [f"arn:aws:events:{REGION}:{ACCOUNT}:rule/{self.name}-{fid}"],
                "detail": {},
            }
            try:
                self._invoke(fid, handler, event)
            except Exception as exc:
                self._failed(fid, exc)

    def _poll_bus_target(self, fid: str, url: str, handler: Callable[[dict[str, Any], Any], Any]) -> None:
        """An EventBridge → Lambda target: one event per invocation, retried on failure."""

        def deliver(messages: list[dict[str, Any]]) -> None:
            for message in messages:
                try:
                    self._invoke(fid, handler, json.loads(message["Body"]))
                    self._delete(url, message)
                except Exception as exc:  # EventBridge retries async targets; so do we
                    self._failed(fid, exc)
                    self._retry_later(url, message)

        self._poll(fid, url, deliver)

    def _poll_observer(self, url: str) -> None:
        """The local timeline: every trainguard event on the bus, in arrival order."""

        def deliver(messages: list[dict[str, Any]]) -> None:
            for message in messages:
                event = json.loads(message["Body"])
                self.events.append(event)
                for callback in self.on_event:
                    callback(event)
                self._delete(url, message)

        self._poll("observer", url, deliver)

    # inspection -------------------------------------------------------------------------
    def sent_notifications(self) -> list[dict[str, Any]]:
        """What SNS published: subject, the email and SMS texts, and which channels took it."""
        assert self.resources is not None
        from moto.sns.models import sns_backends

        topic = sns_backends[ACCOUNT][REGION].topics[self.resources.topic_arn]
        out = []
        for message_id, message, subject, attributes, _ in list(topic.sent_notifications):
            try:
                texts = json.loads(message)
            except json.JSONDecodeError:
                texts = {"default": message}
            channels = json.loads((attributes or {}).get("actions", {}).get("Value", "[]") or "[]")
            out.append(
                {
                    "message_id": message_id,
                    "subject": subject,
                    "email": texts.get("email", texts.get("default")),
                    "sms": texts.get("sms", texts.get("default")),
                    "channels": channels,
                }
            )
        return out

    def dlq_messages(self, queue_id: str = "ingest") -> list[dict[str, Any]]:
        assert self.resources is not None
        sqs = clients.client("sqs")
        resp = sqs.receive_message(
            QueueUrl=self.resources.dlqs[queue_id],
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            VisibilityTimeout=0,
        )
        return list(resp.get("Messages", []))

    def wait_idle(self, timeout: float = 30.0, settle: float = 0.3) -> bool:
        """Wait until every queue is empty (nothing visible or in flight) for ``settle`` seconds."""
        assert self.resources is not None
        sqs = clients.client("sqs")
        urls = list(self.resources.queues.values()) + list(self.resources.targets.values())
        deadline = time.monotonic() + timeout
        quiet_since: float | None = None
        while time.monotonic() < deadline:
            busy = False
            for url in urls:
                attrs = sqs.get_queue_attributes(
                    QueueUrl=url,
                    AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
                )["Attributes"]
                if int(attrs["ApproximateNumberOfMessages"]) or int(
                    attrs["ApproximateNumberOfMessagesNotVisible"]
                ):
                    busy = True
                    break
            now = time.monotonic()
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= settle:
                return True
            time.sleep(0.05)
        return False


def _sqs_record(message: dict[str, Any], arn: str) -> dict[str, Any]:
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": message.get("Attributes", {}),
        "messageAttributes": message.get("MessageAttributes", {}),
        "md5OfBody": message.get("MD5OfBody", ""),
        "eventSource": "aws:sqs",
        "eventSourceARN": arn,
        "awsRegion": REGION,
    }
