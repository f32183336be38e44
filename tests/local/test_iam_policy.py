"""The IAM policy evaluator the end-to-end checks rely on: AWS's documented evaluation rules."""

from __future__ import annotations

import pytest
from trainguard.local.iam_policy import (
    Request,
    UnsupportedPolicy,
    arn_like,
    condition_holds,
    evaluate,
)

BUCKET = "arn:aws:s3:::data"


def policy(*statements: dict) -> dict:
    return {"Version": "2012-10-17", "Statement": list(statements)}


def allow(action, resource, **extra) -> dict:
    return {"Effect": "Allow", "Action": action, "Resource": resource, **extra}


def test_implicit_deny_allow_and_explicit_deny_wins():
    docs = [
        policy(allow("s3:PutObject", f"{BUCKET}/jobs/*", Sid="Write")),
        policy(
            {
                "Sid": "NoControl",
                "Effect": "Deny",
                "Action": "s3:PutObject",
                "Resource": f"{BUCKET}/jobs/*/control/*",
            }
        ),
    ]
    assert evaluate(docs, Request("s3:PutObject", f"{BUCKET}/jobs/a/x")).reason == "allowed by Write"
    denied = evaluate(docs, Request("s3:PutObject", f"{BUCKET}/jobs/a/control/stop.json"))
    assert not denied and denied.reason == "explicit deny by NoControl"
    assert not evaluate(docs, Request("s3:GetObject", f"{BUCKET}/jobs/a/x"))
    assert evaluate(docs, Request("s3:GetObject", f"{BUCKET}/jobs/a/x")).reason == "no statement allows it"


def test_actions_are_case_insensitive_globs_and_not_action():
    docs = [policy(allow("dynamodb:*Item", "*"))]
    assert evaluate(docs, Request("DynamoDB:PutItem", "arn:aws:dynamodb:us-east-1:1:table/t"))
    assert not evaluate(docs, Request("dynamodb:Query", "arn:aws:dynamodb:us-east-1:1:table/t"))
    docs = [policy({"Effect": "Allow", "NotAction": "s3:Delete*", "Resource": "*"})]
    assert evaluate(docs, Request("s3:GetObject", BUCKET)) and not evaluate(
        docs, Request("s3:DeleteObject", BUCKET)
    )


def test_resources_match_per_arn_segment_and_exactly():
    assert arn_like("arn:aws:sqs:*:123:q", "arn:aws:sqs:eu-west-1:123:q")
    assert not arn_like("arn:aws:sqs:*:123:q", "arn:aws:sqs:eu-west-1:123:q2")
    # a wildcard in one segment never spans into the next
    assert not arn_like("arn:aws:sqs:*", "arn:aws:sqs:eu-west-1:123:q")
    assert arn_like("arn:aws:s3:::data/jobs/?/x", "arn:aws:s3:::data/jobs/a/x")
    assert not arn_like("arn:aws:s3:::data/jobs/?/x", "arn:aws:s3:::data/jobs/ab/x")
    assert not arn_like("arn:aws:s3:::Data/*", "arn:aws:s3:::data/k")  # case-sensitive
    # the bucket itself is not one of its objects
    docs = [policy(allow("s3:ListBucket", f"{BUCKET}/*"))]
    assert not evaluate(docs, Request("s3:ListBucket", BUCKET))


def test_not_resource():
    docs = [policy({"Effect": "Allow", "Action": "s3:GetObject", "NotResource": f"{BUCKET}/secret/*"})]
    assert evaluate(docs, Request("s3:GetObject", f"{BUCKET}/jobs/a"))
    assert not evaluate(docs, Request("s3:GetObject", f"{BUCKET}/secret/a"))


TAGGED = policy(allow("s3:PutObject", f"{BUCKET}/jobs/${{aws:PrincipalTag/job}}/*"))


def test_policy_variables_resolve_from_the_request_context():
    ctx = {"aws:PrincipalTag/job": "run-1"}
    assert evaluate([TAGGED], Request("s3:PutObject", f"{BUCKET}/jobs/run-1/manifest.json", ctx))
    # the "/" after the variable: run-1 does not reach run-10
    assert not evaluate([TAGGED], Request("s3:PutObject", f"{BUCKET}/jobs/run-10/manifest.json", ctx))
    # condition keys are case-insensitive
    assert evaluate([TAGGED], Request("s3:PutObject", f"{BUCKET}/jobs/a/x", {"AWS:principaltag/JOB": "a"}))


def test_an_unresolvable_variable_matches_nothing():
    assert not evaluate([TAGGED], Request("s3:PutObject", f"{BUCKET}/jobs//x"))
    assert not evaluate([TAGGED], Request("s3:PutObject", f"{BUCKET}/jobs/${{aws:PrincipalTag/job}}/x"))


def test_a_substituted_value_is_literal_never_a_wildcard():
    ctx = {"aws:PrincipalTag/job": "*"}
    assert not evaluate([TAGGED], Request("s3:PutObject", f"{BUCKET}/jobs/other/x", ctx))
    assert evaluate([TAGGED], Request("s3:PutObject", f"{BUCKET}/jobs/*/x", ctx))


def test_literal_escapes():
    docs = [policy(allow("s3:GetObject", f"{BUCKET}/a${{*}}b"))]
    assert evaluate(docs, Request("s3:GetObject", f"{BUCKET}/a*b"))
    assert not evaluate(docs, Request("s3:GetObject", f"{BUCKET}/axb"))


@pytest.mark.parametrize(
    ("operator", "values", "context", "expected"),
    [
        ("StringEquals", ["trainguard"], {"events:source": "trainguard"}, True),
        ("StringEquals", ["trainguard"], {"events:source": "Trainguard"}, False),
        ("StringEquals", ["trainguard"], {}, False),
        ("StringEqualsIgnoreCase", ["trainguard"], {"events:source": "TrainGuard"}, True),
        ("StringNotEquals", ["x"], {}, True),  # negated: true for a missing key
        ("StringNotEquals", ["x"], {"events:source": "x"}, False),
        ("StringLike", ["?*"], {"events:source": ""}, False),
        ("StringLike", ["?*"], {"events:source": "a"}, True),
        ("StringNotLike", ["*/*"], {"events:source": "a/b"}, False),
        ("StringNotLike", ["*/*"], {"events:source": "ab"}, True),
        ("StringEqualsIfExists", ["x"], {}, True),
        ("StringEqualsIfExists", ["x"], {"events:source": "y"}, False),
        ("Null", ["true"], {}, True),
        ("Null", ["false"], {}, False),
        ("Null", ["false"], {"events:source": ""}, True),
        ("Bool", ["false"], {"events:source": "false"}, True),
        ("NumericLessThan", ["10"], {"events:source": "3"}, True),
        ("NumericLessThan", ["10"], {"events:source": "30"}, False),
        ("ArnLike", ["arn:aws:sqs:*:1:q"], {"events:source": "arn:aws:sqs:r:1:q"}, True),
    ],
)
def test_condition_operators(operator, values, context, expected):
    assert condition_holds(operator, "events:source", values, context) is expected


def test_several_values_are_ored_keys_and_operators_anded():
    st = allow(
        "events:PutEvents",
        "*",
        Condition={
            "StringEquals": {"events:source": ["a", "b"], "events:detail-type": ["t"]},
            "Null": {"aws:PrincipalTag/x": "false"},
        },
    )
    ok = {"events:source": "b", "events:detail-type": "t", "aws:PrincipalTag/x": "1"}
    assert evaluate([policy(st)], Request("events:PutEvents", "arn:aws:events:r:1:event-bus/b", ok))
    for key in ok:
        ctx = {k: v for k, v in ok.items() if k != key}
        assert not evaluate([policy(st)], Request("events:PutEvents", "arn:aws:events:r:1:event-bus/b", ctx))


def test_set_qualifiers_for_multivalued_keys():
    pk = ("JOB#a", "JOB#b")
    assert condition_holds(
        "ForAllValues:StringLike", "dynamodb:LeadingKeys", ["JOB#*"], {"dynamodb:LeadingKeys": pk}
    )
    mixed = {"dynamodb:LeadingKeys": ("JOB#a", "idempotency#notify")}
    assert not condition_holds("ForAllValues:StringLike", "dynamodb:LeadingKeys", ["JOB#*"], mixed)
    assert condition_holds("ForAnyValue:StringLike", "dynamodb:LeadingKeys", ["JOB#*"], mixed)
    # ForAllValues is vacuously true without the key (why AWS pairs it with a Null check)
    assert condition_holds("ForAllValues:StringLike", "dynamodb:LeadingKeys", ["JOB#*"], {})
    assert not condition_holds("ForAnyValue:StringLike", "dynamodb:LeadingKeys", ["JOB#*"], {})


def test_variables_in_condition_values():
    assert condition_holds(
        "StringEquals",
        "s3:prefix",
        ["jobs/${aws:username}/"],
        {"s3:prefix": "jobs/ann/", "aws:username": "ann"},
    )


def test_unmodelled_operators_raise_instead_of_guessing():
    with pytest.raises(UnsupportedPolicy):
        condition_holds("DateLessThan", "aws:CurrentTime", ["2030-01-01"], {"aws:CurrentTime": "x"})
    with pytest.raises(UnsupportedPolicy):
        evaluate([policy({"Effect": "Allow", "Resource": "*"})], Request("s3:GetObject", BUCKET))
