"""The deployed permissions, enforced in the local mode and checked call by call.

Two layers, because moto's IAM is only part of AWS's:

1. **moto enforces** (``INITIAL_NO_AUTH_ACTION_COUNT``): the local runtime creates one IAM user
   per function, with the function's statements from ``trainguard.wiring``, and runs each
   handler with that user's keys (``trainguard.service.clients.acting_as``); the training
   job gets a user with ``TRAINING_POLICY``. moto then denies an action the policy does not
   grant (S3 and SQS resources included). :func:`moto_policy` renders a policy the way moto
   can apply it: moto sees DynamoDB, EventBridge, SNS and SageMaker resources as ``*``,
   ignores conditions and does not resolve policy variables.
2. **every call is checked**: :class:`CallRecorder` records each AWS call made in the process
   (who made it, the operation, its parameters, the answer) and :func:`check_calls` asks
   ``trainguard.local.iam_policy`` whether AWS would allow each one under the synthesized
   template's policy for that principal — resources, conditions (``dynamodb:LeadingKeys``,
   ``events:source``, ``aws:ResourceTag``, ``aws:PrincipalTag``) and the 403-for-404 rule of S3
   included. The end-to-end tests fail on any call AWS would deny.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from trainguard.local.iam_policy import ContextValue, Decision, Request, evaluate, substitute
from trainguard.service.clients import Credentials

#: services whose resource moto computes for its IAM check (every other one sees "*")
MOTO_RESOURCE_AWARE = ("s3", "sqs")
#: moto asks for these actions, which AWS does not have: AWS authorizes a transaction item by
#: item as the single-item actions (docs: "Using IAM with DynamoDB transactions")
MOTO_ONLY_ACTIONS = {
    "dynamodb:TransactWriteItems": (
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        "dynamodb:ConditionCheckItem",
    ),
    "dynamodb:TransactGetItems": ("dynamodb:GetItem",),
}
#: the note of the ListBucket request behind a 404 (AWS says 403 without it)
MISSING_NEEDS_LIST = "(a 404 needs s3:ListBucket)"
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


# ----------------------------------------------------------------------------- recording


@dataclass(frozen=True)
class Call:
    """One AWS API call as the SDK made it."""

    principal: str
    service: str
    operation: str
    params: Mapping[str, Any]
    region: str
    status: int
    error_code: str = ""

    def __str__(self) -> str:
        outcome = f"{self.status} {self.error_code}".strip()
        return f"{self.principal}: {self.service}.{self.operation} → {outcome}"


def _drop_bodies(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: ("<body>" if k == "Body" else v) for k, v in params.items()}


class CallRecorder:
    """Records every botocore call of the process made with a known access key.

    Installed through botocore's handler list, so every session created while it is
    installed (``trainguard.service.clients`` resets its own) carries it. A call is
    attributed by the access key that signed it, so it follows the identity across threads
    (the hook uploads from its own thread).
    """

    def __init__(self, identities: Mapping[str, str] | None = None) -> None:
        #: access key id → principal name
        self.identities: dict[str, str] = dict(identities or {})
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._specs: list[tuple[Any, ...]] = []

    # botocore handlers
    def _params(self, params: Mapping[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["trainguard_params"] = _drop_bodies(params)

    def _signed(self, request: Any, **_: Any) -> None:
        auth = request.headers.get("Authorization", b"")
        text = auth.decode() if isinstance(auth, bytes) else str(auth)
        match = _CREDENTIAL.search(text)
        if match is not None and isinstance(getattr(request, "context", None), dict):
            request.context["trainguard_access_key"] = match.group(1)

    def _after(
        self, http_response: Any, parsed: Mapping[str, Any], model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        key = context.get("trainguard_access_key", "")
        call = Call(
            principal=self.identities.get(key, f"unknown:{key}"),
            service=model.service_model.service_name,
            operation=model.name,
            params=context.get("trainguard_params", {}),
            region=str(context.get("client_region") or ""),
            status=int(getattr(http_response, "status_code", 0)),
            error_code=str(parsed.get("Error", {}).get("Code", "")) if isinstance(parsed, Mapping) else "",
        )
        with self._lock:
            self.calls.append(call)

    def install(self) -> None:
        from botocore import handlers

        from trainguard.service import clients

        self._specs = [
            ("before-parameter-build", self._params),
            ("request-created", self._signed, handlers.REGISTER_LAST),
            ("after-call", self._after),
        ]
        handlers.BUILTIN_HANDLERS.extend(self._specs)
        clients.reset()  # new sessions pick the handlers up

    def uninstall(self) -> None:
        from botocore import handlers

        from trainguard.service import clients

        for spec in self._specs:
            if spec in handlers.BUILTIN_HANDLERS:
                handlers.BUILTIN_HANDLERS.remove(spec)
        self._specs = []
        clients.reset()

    def of(self, principal: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.principal == principal]


@contextmanager
def record_calls(identities: Mapping[str, str] | None = None) -> Iterator[CallRecorder]:
    recorder = CallRecorder(identities)
    recorder.install()
    try:
        yield recorder
    finally:
        recorder.uninstall()


# ----------------------------------------------------------------------------- calls → IAM requests


@dataclass(frozen=True)
class Account:
    """What an ARN needs besides the call: the account, and the table's key schema."""

    account_id: str = "123456789012"
    partition: str = "aws"
    #: partition-key attribute of the table and of each of its indexes (dynamodb:LeadingKeys)
    partition_key: str = "pk"
    index_partition_keys: Mapping[str, str] = field(default_factory=dict)
    #: tags of resources (ARN → {key: value}): aws:ResourceTag/<key> of a request on them
    resource_tags: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


def _s(value: Any) -> str:
    """The string of a DynamoDB attribute value ({"S": "x"} → "x")."""
    if isinstance(value, Mapping):
        for kind in ("S", "N", "B"):
            if kind in value:
                return str(value[kind])
    return str(value)


def _leading_key(params: Mapping[str, Any], attribute: str) -> str | None:
    """The partition-key value of a Query's KeyConditionExpression ``<attribute> = :v``."""
    expression = str(params.get("KeyConditionExpression", ""))
    names = {v: k for k, v in (params.get("ExpressionAttributeNames") or {}).items()}
    for name, placeholder in re.findall(r"([#\w]+)\s*=\s*(:\w+)", expression):
        if names.get(name, name) == attribute or name == attribute:
            value = (params.get("ExpressionAttributeValues") or {}).get(placeholder)
            return None if value is None else _s(value)
    return None


def _dynamodb(call: Call, account: Account) -> list[Request]:
    p, region = call.params, call.region

    def table_arn(name: str, index: str | None = None) -> str:
        arn = f"arn:{account.partition}:dynamodb:{region}:{account.account_id}:table/{name}"
        return f"{arn}/index/{index}" if index else arn

    def request(action: str, table: str, keys: Sequence[str], index: str | None = None) -> Request:
        context: dict[str, ContextValue] = {"dynamodb:LeadingKeys": tuple(keys)} if keys else {}
        return Request(f"dynamodb:{action}", table_arn(table, index), context, str(call))

    pk = account.partition_key
    op = call.operation
    if op in ("GetItem", "DeleteItem", "UpdateItem"):
        return [request(op, p["TableName"], [_s(p["Key"][pk])] if pk in p.get("Key", {}) else [])]
    if op == "PutItem":
        return [request(op, p["TableName"], [_s(p["Item"][pk])] if pk in p.get("Item", {}) else [])]
    if op == "Query":
        index = p.get("IndexName")
        attribute = account.index_partition_keys.get(index, pk) if index else pk
        key = _leading_key(p, attribute)
        return [request(op, p["TableName"], [key] if key is not None else [], index)]
    if op == "BatchWriteItem":
        out = []
        for table, items in (p.get("RequestItems") or {}).items():
            keys = []
            for item in items:
                body = (
                    item.get("PutRequest", {}).get("Item") or item.get("DeleteRequest", {}).get("Key") or {}
                )
                if pk in body:
                    keys.append(_s(body[pk]))
            out.append(request(op, table, keys))
        return out
    if op == "TransactWriteItems":  # authorized item by item, as the single-item actions
        actions = {
            "Put": "PutItem",
            "Update": "UpdateItem",
            "Delete": "DeleteItem",
            "ConditionCheck": "ConditionCheckItem",
        }
        out = []
        for item in p.get("TransactItems", []):
            ((kind, body),) = item.items()
            keyed = body.get("Item") or body.get("Key") or {}
            out.append(request(actions[kind], body["TableName"], [_s(keyed[pk])] if pk in keyed else []))
        return out
    table = p.get("TableName")
    return [request(op, str(table), [])] if table else [Request(f"dynamodb:{op}", "*", {}, str(call))]


_S3_ACTIONS = {
    "HeadObject": "GetObject",
    "GetObject": "GetObject",
    "PutObject": "PutObject",
    "CreateMultipartUpload": "PutObject",
    "UploadPart": "PutObject",
    "CompleteMultipartUpload": "PutObject",
    "ListObjectsV2": "ListBucket",
    "ListObjects": "ListBucket",
    "HeadBucket": "ListBucket",
}


def _s3(call: Call, account: Account) -> list[Request]:
    p = call.params
    bucket_arn = f"arn:{account.partition}:s3:::{p.get('Bucket', '*')}"
    action = f"s3:{_S3_ACTIONS.get(call.operation, call.operation)}"
    if "Key" in p:
        out = [Request(action, f"{bucket_arn}/{p['Key']}", {}, str(call))]
        if call.operation in ("GetObject", "HeadObject") and (
            call.status == 404 or call.error_code in ("NoSuchKey", "404", "NotFound")
        ):
            # AWS answers a missing key with 404 only to a caller that may list the bucket;
            # to anyone else it is 403 AccessDenied (moto always says 404)
            out.append(Request("s3:ListBucket", bucket_arn, {}, f"{call} {MISSING_NEEDS_LIST}"))
        return out
    context: dict[str, ContextValue] = {"s3:prefix": str(p["Prefix"])} if "Prefix" in p else {}
    return [Request(action, bucket_arn, context, str(call))]


def _events(call: Call, account: Account) -> list[Request]:
    if call.operation != "PutEvents":
        return [Request(f"events:{call.operation}", "*", {}, str(call))]
    out = []
    for entry in call.params.get("Entries", []):
        bus = str(entry.get("EventBusName") or "default")
        arn = (
            bus
            if bus.startswith("arn:")
            else (f"arn:{account.partition}:events:{call.region}:{account.account_id}:event-bus/{bus}")
        )
        context: dict[str, ContextValue] = {
            "events:source": str(entry.get("Source", "")),
            "events:detail-type": str(entry.get("DetailType", "")),
        }
        out.append(Request("events:PutEvents", arn, context, str(call)))
    return out


def _sqs(call: Call, account: Account) -> list[Request]:
    url = str(call.params.get("QueueUrl", ""))
    path = urlparse(url).path.strip("/").split("/")
    arn = f"arn:{account.partition}:sqs:{call.region}:{path[0]}:{path[-1]}" if len(path) >= 2 else "*"
    return [Request(f"sqs:{call.operation}", arn, {}, str(call))]


def _sns(call: Call, account: Account) -> list[Request]:
    arn = str(call.params.get("TopicArn") or call.params.get("TargetArn") or "*")
    return [Request(f"sns:{call.operation}", arn, {}, str(call))]


def _sagemaker(call: Call, account: Account) -> list[Request]:
    p = call.params
    if "TrainingJobName" in p:
        # SageMaker ARNs carry the name in lower case
        arn = (
            f"arn:{account.partition}:sagemaker:{call.region}:{account.account_id}:"
            f"training-job/{str(p['TrainingJobName']).lower()}"
        )
    else:
        arn = str(p.get("ResourceArn", "*"))
    tags = account.resource_tags.get(arn, {})
    context: dict[str, ContextValue] = {f"aws:ResourceTag/{k}": v for k, v in tags.items()}
    return [Request(f"sagemaker:{call.operation}", arn, context, str(call))]


_MAPPERS = {
    "dynamodb": _dynamodb,
    "s3": _s3,
    "events": _events,
    "sqs": _sqs,
    "sns": _sns,
    "sagemaker": _sagemaker,
}


def requests_for(call: Call, account: Account | None = None) -> list[Request]:
    """The IAM authorization requests AWS makes for one call."""
    account = account or Account()
    mapper = _MAPPERS.get(call.service)
    if mapper is None:
        return [Request(f"{call.service}:{call.operation}", "*", {}, str(call))]
    return mapper(call, account)


@dataclass(frozen=True)
class Denial:
    call: Call
    request: Request
    decision: Decision

    def __str__(self) -> str:
        request = self.request
        return f"{request.note or self.call}: {request.action} on {request.resource} — {self.decision.reason}"


def check_calls(
    calls: Sequence[Call],
    policies: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    account: Account | None = None,
    principal_context: Mapping[str, Mapping[str, ContextValue]] | None = None,
    missing_as_403_ok: Iterable[str] = (),
) -> list[Denial]:
    """Every request of ``calls`` that AWS would deny under ``policies`` (by principal).

    A call of a principal with no policy is a denial too: nothing may call AWS unaccounted.
    ``principal_context`` adds keys such as ``aws:PrincipalTag/<key>`` for a principal.
    ``missing_as_403_ok`` names principals whose code reads AWS's 403 for a missing key as
    "missing" (the hook's stop-signal poll), so a 404 they got here needs no s3:ListBucket.
    """
    account = account or Account()
    tolerant = set(missing_as_403_ok)
    denials: list[Denial] = []
    for call in calls:
        docs = policies.get(call.principal)
        extra = (principal_context or {}).get(call.principal, {})
        for request in requests_for(call, account):
            if call.principal in tolerant and request.note.endswith(MISSING_NEEDS_LIST):
                continue
            request = Request(request.action, request.resource, {**request.context, **extra}, request.note)
            decision = evaluate(docs, request) if docs is not None else Decision(False, "unknown principal")
            if not decision:
                denials.append(Denial(call, request, decision))
    return denials


def used_actions(calls: Sequence[Call], account: Account | None = None) -> set[str]:
    return {r.action for c in calls for r in requests_for(c, account)}


# ----------------------------------------------------------------------------- moto


def moto_policy(
    document: Mapping[str, Any], principal_context: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``document`` as moto can enforce it (check_calls covers the rest, exactly).

    Policy variables are resolved for the principal (moto does not); statements are kept
    with their resources where moto computes the resource (S3, SQS) and on ``*`` elsewhere;
    conditions are dropped (moto ignores them, or turns a failed one into a Deny); a Deny
    that depends on a condition is dropped (moto would apply it unconditionally).
    """
    context = dict(principal_context or {})
    out = []
    for st in document.get("Statement", []):
        if st.get("Effect") == "Deny" and st.get("Condition"):
            continue
        actions = list(st["Action"]) if isinstance(st["Action"], list) else [st["Action"]]
        actions += [alias for alias, real in MOTO_ONLY_ACTIONS.items() if set(real) & set(actions)]
        resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        resolved = []
        for r in resources:
            value = substitute(str(r), context)
            if value is None:
                break  # unresolvable for this principal: the statement grants it nothing
            resolved.append(value)
        else:
            services = {a.split(":", 1)[0] for a in actions}
            aware = services <= set(MOTO_RESOURCE_AWARE)
            out.append(
                {
                    "Sid": st.get("Sid", "S"),
                    "Effect": st["Effect"],
                    "Action": actions,
                    "Resource": resolved if aware else ["*"],
                }
            )
    return {"Version": "2012-10-17", "Statement": out}


class MotoIam:
    """IAM users in moto, one per principal, each with one inline policy and an access key."""

    def __init__(self, iam_client: Any, prefix: str) -> None:
        self.iam = iam_client
        self.prefix = prefix
        self.credentials: dict[str, Credentials] = {}
        #: principal → the policy document moto enforces for it
        self.policies: dict[str, dict[str, Any]] = {}

    def create(
        self, principal: str, document: Mapping[str, Any], tags: Mapping[str, str] | None = None
    ) -> Credentials:
        user = f"{self.prefix}-{principal}"[:64]
        self.iam.create_user(UserName=user, Tags=[{"Key": k, "Value": v} for k, v in (tags or {}).items()])
        rendered = moto_policy(document, {f"aws:PrincipalTag/{k}": v for k, v in (tags or {}).items()})
        if rendered["Statement"]:
            self.iam.put_user_policy(
                UserName=user, PolicyName="trainguard", PolicyDocument=json.dumps(rendered)
            )
        key = self.iam.create_access_key(UserName=user)["AccessKey"]
        creds = Credentials(principal, key["AccessKeyId"], key["SecretAccessKey"])
        self.credentials[principal] = creds
        self.policies[principal] = rendered
        return creds

    def identities(self) -> dict[str, str]:
        """access key id → principal (for a CallRecorder)."""
        return {c.access_key_id: name for name, c in self.credentials.items()}


@contextmanager
def moto_authorization() -> Iterator[None]:
    """From now on moto authenticates every request and authorizes it against IAM.

    Process-wide (moto keeps the switch in its settings): restored on exit.
    """
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin

    saved = (settings.INITIAL_NO_AUTH_ACTION_COUNT, ActionAuthenticatorMixin.request_count)
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    ActionAuthenticatorMixin.request_count = 0
    try:
        yield
    finally:
        settings.INITIAL_NO_AUTH_ACTION_COUNT, ActionAuthenticatorMixin.request_count = saved


class LocalAuthority:
    """The local runtime's identities: an operator, one user per function, one per training job.

    ``resolve`` turns a wiring Ref into the local resource's ARN. :meth:`start` runs while moto
    still accepts unauthenticated requests (it creates the users), then switches
    authorization on; :meth:`stop` switches it off again.
    """

    OPERATOR = "operator"

    def __init__(
        self,
        wiring: Any,
        resolve: Any,
        prefix: str,
        features: frozenset[str] = frozenset(),
        account: Account | None = None,
    ) -> None:
        self.wiring = wiring
        self.resolve = resolve
        self.prefix = prefix
        self.features = features
        self.account = account or Account(index_partition_keys={})
        self.users: MotoIam | None = None
        self.recorder = CallRecorder()
        self._authorization: Any = None
        #: principal → the full policy document (the wiring's, resolved locally)
        self.documents: dict[str, dict[str, Any]] = {}
        self.principal_tags: dict[str, dict[str, str]] = {}

    def start(self, iam_client: Any) -> Credentials:
        """Create the users; return the operator's credentials (the runtime's own calls)."""
        from trainguard.wiring import policy_document

        self.users = MotoIam(iam_client, self.prefix)
        operator_doc = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
        }
        operator = self.users.create(self.OPERATOR, operator_doc)
        self.documents[self.OPERATOR] = operator_doc
        for fn in self.wiring.functions:
            doc = policy_document(self.wiring.statements(fn.id, self.features), self.resolve)
            self.users.create(fn.id, doc)
            self.documents[fn.id] = doc
        self.recorder.identities.update(self.users.identities())
        self.recorder.install()
        self._authorization = moto_authorization()
        self._authorization.__enter__()
        return operator

    def training_job(self, job: str) -> Credentials:
        """A training job's identity: TRAINING_POLICY, tagged with its one job name."""
        from trainguard.wiring import TRAINING_JOB_TAG, TRAINING_POLICY, policy_document

        assert self.users is not None, "start() first"
        principal = f"job:{job}"
        if principal in self.users.credentials:
            return self.users.credentials[principal]
        doc = policy_document(TRAINING_POLICY, self.resolve)
        tags = {TRAINING_JOB_TAG: job}
        creds = self.users.create(principal, doc, tags)
        self.documents[principal] = doc
        self.principal_tags[principal] = tags
        self.recorder.identities[creds.access_key_id] = principal
        return creds

    def credentials(self, principal: str) -> Credentials | None:
        return None if self.users is None else self.users.credentials.get(principal)

    def principal_context(self) -> dict[str, dict[str, ContextValue]]:
        return {
            p: {f"aws:PrincipalTag/{k}": v for k, v in tags.items()}
            for p, tags in self.principal_tags.items()
        }

    def denials(self) -> list[Denial]:
        """Recorded calls AWS would deny under the wiring's policies (resolved locally)."""
        return check_calls(
            self.recorder.calls,
            {p: [d] for p, d in self.documents.items()},
            account=self.account,
            principal_context=self.principal_context(),
        )

    def stop(self) -> None:
        if self._authorization is not None:
            self._authorization.__exit__(None, None, None)
            self._authorization = None
        self.recorder.uninstall()
