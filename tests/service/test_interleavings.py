"""Deterministic replays of the interleavings that once lost a wake-up (found by the property test)."""

from trainguard.local.synthetic import SyntheticJob


def test_a_step_read_before_the_manifest_commit_is_still_evaluated(aws):
    job = SyntheticJob("race", steps=[0, 1, 2], nan_steps=frozenset({2}))
    keys = {k.split("/", 2)[2]: k for k in aws.put_job("race", job.objects())}
    early = aws.service()
    for rel in (
        "end/worker-00000.json",
        "steps/000000000000/worker-00000.safetensors",
        "steps/000000000001/worker-00000.safetensors",
    ):
        early.handle_object(aws.bucket, keys[rel])

    manifest_side, step_side = aws.service(), aws.service()
    original_load = manifest_side.store.load
    interleaved = []

    def load(job_name):
        loaded = original_load(job_name)
        if not interleaved:
            interleaved.append(True)
            # the last step arrives now: its invocation reads the state before the manifest
            # is committed, sees no rules yet, and has nothing to do
            step_side.handle_object(aws.bucket, keys["steps/000000000002/worker-00000.safetensors"])
        return loaded

    manifest_side.store.load = load
    manifest_side.handle_object(aws.bucket, keys["manifest.json"])
    state, _ = manifest_side.store.load_state("race")
    assert interleaved and state.finished and state.watermark == 2
    assert state.rule("ExplodingTensor").status == "IssuesFound" and state.rule("ExplodingTensor").step == 2


def test_a_segment_read_before_the_manifest_commit_is_still_evaluated(aws):
    from trainguard.format.convert import WindowRules, convert_objects

    job = SyntheticJob("race2", steps=list(range(9)), nan_steps=frozenset({8}))
    objects = convert_objects(job.objects(), WindowRules(window_s=None, max_steps=3))
    keys = {k.split("/", 2)[2]: k for k in aws.put_job("race2", objects)}
    segments = sorted(k for k in keys if k.startswith("segments/"))
    early = aws.service()
    for rel in ["end/worker-00000.json", *segments[:-1]]:
        early.handle_object(aws.bucket, keys[rel])

    manifest_side, segment_side = aws.service(), aws.service()
    original_load = manifest_side.store.load
    interleaved = []

    def load(job_name):
        loaded = original_load(job_name)
        if not interleaved:
            interleaved.append(True)
            segment_side.handle_object(aws.bucket, keys[segments[-1]])
        return loaded

    manifest_side.store.load = load
    manifest_side.handle_object(aws.bucket, keys["manifest.json"])
    state, _ = manifest_side.store.load_state("race2")
    assert interleaved and state.finished and state.watermark == 8
    assert state.rule("ExplodingTensor").status == "IssuesFound" and state.rule("ExplodingTensor").step == 8
