"""The synthesized template's IAM policies, resolved against a local cloud's resources.

The end-to-end tests check every recorded AWS call against *the template* (what CloudFormation
would deploy), not against the wiring it was built from: a stack that drifted from the wiring
fails here too.
"""

from __future__ import annotations

from typing import Any

from trainguard.local.runtime import ACCOUNT, REGION, LocalCloud

PSEUDO = {
    "AWS::Partition": "aws",
    "AWS::Region": REGION,
    "AWS::AccountId": ACCOUNT,
    "AWS::URLSuffix": "amazonaws.com",
}


def logical_id(stack: Any, construct: Any) -> str:
    return str(stack.resolve(stack.get_logical_id(construct.node.default_child)))


def local_values(stack: Any, cloud: LocalCloud) -> dict[str, dict[str, str]]:
    """Logical id → {"Arn": ..., "Ref": ...} of the stack's resources in ``cloud``."""
    from trainguard.wiring import Ref

    res = cloud.resources
    assert res is not None
    values = {
        logical_id(stack, stack.bucket): {"Arn": cloud.arn(Ref("bucket")), "Ref": res.bucket},
        logical_id(stack, stack.table): {"Arn": cloud.arn(Ref("table")), "Ref": res.table},
        logical_id(stack, stack.bus): {"Arn": cloud.arn(Ref("bus")), "Ref": res.bus, "Name": res.bus},
        logical_id(stack, stack.alert_topic): {"Ref": res.topic_arn},
        logical_id(stack, stack.topic_key): {"Arn": cloud.arn(Ref("topic-key"))},
    }
    for qid, url in res.dlqs.items():
        values[logical_id(stack, stack.dlqs[f"{qid}-dlq"])] = {
            "Arn": cloud.arn(Ref(f"{qid}-dlq")),
            "Ref": url,
        }
    return values


def resolve(node: Any, values: dict[str, dict[str, str]]) -> Any:
    """CloudFormation intrinsics → strings (resources outside ``values`` stay visibly unresolved)."""
    if isinstance(node, list):
        return [resolve(n, values) for n in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        ((fn, arg),) = node.items()
        if fn == "Ref":
            return PSEUDO.get(arg) or values.get(arg, {}).get("Ref", f"unresolved:{arg}")
        if fn == "Fn::GetAtt":
            return values.get(arg[0], {}).get(arg[1], f"unresolved:{arg[0]}.{arg[1]}")
        if fn == "Fn::Join":
            sep, parts = arg
            return sep.join(str(resolve(p, values)) for p in parts)
    return {k: resolve(v, values) for k, v in node.items()}


def role_policies(
    template: dict[str, Any], stack: Any, fid: str, values: dict[str, dict[str, str]]
) -> list[dict]:
    """Every policy document attached to the function's role (its grants and CDK's default)."""
    role = {"Ref": logical_id(stack, stack.functions[fid].role)}
    return [
        resolve(r["Properties"]["PolicyDocument"], values)
        for r in template["Resources"].values()
        if r["Type"] == "AWS::IAM::Policy" and role in r["Properties"].get("Roles", [])
    ]


def training_policy(template: dict[str, Any], stack: Any, values: dict[str, dict[str, str]]) -> dict:
    doc = template["Resources"][logical_id(stack, stack.training_policy)]["Properties"]["PolicyDocument"]
    return resolve(doc, values)


def template_policies(template: dict[str, Any], stack: Any, cloud: LocalCloud) -> dict[str, list[dict]]:
    """principal of the local cloud → the template's policies for it (functions, training jobs)."""
    values = local_values(stack, cloud)
    out = {fn.id: role_policies(template, stack, fn.id, values) for fn in cloud.wiring.functions}
    assert cloud.authority is not None
    for principal in cloud.authority.principal_tags:
        out[principal] = [training_policy(template, stack, values)]
    return out
