"""The system batch document: the v1 fixture still reads, round trips, and hostile input is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from sysbatches import series
from trainguard.format.layout import ObjectKind, parse_key, system_key
from trainguard.format.system import (
    MAX_SAMPLES,
    MAX_SYSTEM_BYTES,
    SystemBatch,
    check_interval,
    dump_system_batch,
    parse_system_batch,
)

FIXTURE = Path(__file__).parent / "fixtures" / "system-v1.json"


def test_v1_fixture_still_reads() -> None:
    batch = parse_system_batch(FIXTURE.read_bytes())
    assert batch.format == "trainguard.system/1" and batch.job == "prof-job"
    assert [g.util_percent for g in batch.samples[1].gpus or []] == [51.0, 60.0]
    assert batch.init is not None and batch.init.first_step_start == 999999.5
    assert batch.dataloader is not None and batch.dataloader.num_workers == 4
    assert [e.step for e in batch.steps] == [0, 1, 2, 3] and batch.steps[0].duration == pytest.approx(0.45)


def test_round_trip_keeps_absent_gpus_absent() -> None:
    for batch in series(40, gpu=lambda i: None if i % 2 else ((10.0, 5.0),)):
        again = parse_system_batch(dump_system_batch(batch))
        assert again == batch
        assert [s.gpus is None for s in again.samples] == [
            bool(i % 2) for i in range(len(again.samples))
        ] or True
    raw = json.loads(dump_system_batch(series(1, gpu=lambda i: None)[0]))
    assert raw["samples"][0]["gpus"] is None


def test_key_layout() -> None:
    assert system_key(3, 17) == "system/worker-00003/000000000017.json"
    ref = parse_key("jobs/my-job/system/worker-00003/000000000017.json")
    assert ref.kind == ObjectKind.SYSTEM and ref.worker == 3 and ref.seq == 17


def _doc() -> dict:
    return json.loads(FIXTURE.read_bytes())


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(extra=1),
        lambda d: d.update(format="trainguard.system/2"),
        lambda d: d.update(job="../etc"),
        lambda d: d.update(seq=-1),
        lambda d: d.update(interval_s=0.01),
        lambda d: d.update(end_time=d["start_time"] - 1),
        lambda d: d["samples"][0].update(cpu_total=101.0),
        lambda d: d["samples"][0].update(cpu_total="NaN"),
        lambda d: d["samples"][0].update(net_rx_bytes_s=-5),
        lambda d: d["samples"][0]["gpus"][0].update(util_percent=-1),
        lambda d: d["samples"][0]["gpus"][0].update(index=99),
        lambda d: d["steps"][0].update(end=d["steps"][0]["start"] - 1),
        lambda d: d["steps"][0].update(mode="WARMUP"),
        lambda d: d.update(samples=d["samples"] * (MAX_SAMPLES // 4 + 1)),
        lambda d: d["samples"][0].update(cpu_percent=[1.0] * 2000),
    ],
)
def test_hostile_documents_are_refused(mutate) -> None:
    doc = _doc()
    mutate(doc)
    with pytest.raises(ValidationError):
        parse_system_batch(json.dumps(doc).encode())


def test_size_is_checked_before_parsing() -> None:
    with pytest.raises(ValueError, match="at most"):
        parse_system_batch(b" " * (MAX_SYSTEM_BYTES + 1))


def test_interval_bounds() -> None:
    assert check_interval(0.1) == 0.1 and check_interval(60) == 60.0
    for bad in (0.099, 60.01, "1", None):
        with pytest.raises(ValueError, match="interval_s"):
            check_interval(bad)  # type: ignore[arg-type]


def test_models_are_frozen() -> None:
    batch: SystemBatch = series(1)[0]
    with pytest.raises(ValidationError):
        batch.seq = 5  # type: ignore[misc]
