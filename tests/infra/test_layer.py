"""The Docker-free layer build (layers/build_layer.py) and its CDK local bundler."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from infra.layer import LocalLayerBundling, builder  # noqa: E402


def test_key_is_stable_and_covers_arch_and_compilation() -> None:
    a = builder.layer_key("x86_64", python="py")
    assert a == builder.layer_key("x86_64", python="py")
    assert a != builder.layer_key("arm64", python="py")
    assert a != builder.layer_key("x86_64", python=None)
    with pytest.raises(ValueError):
        builder.layer_key("sparc")


def test_key_changes_with_the_trainguard_sources(tmp_path: Path) -> None:
    pkg = tmp_path / "shared" / "trainguard"
    pkg.mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text("[project]\nname='trainguard'\n")
    (pkg / "__init__.py").write_text("")
    before = builder.layer_key("x86_64", repo=tmp_path, python="py")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "x.cpython-312.pyc").write_bytes(b"ignored")
    assert builder.layer_key("x86_64", repo=tmp_path, python="py") == before
    (pkg / "rule.py").write_text("X = 1\n")
    assert builder.layer_key("x86_64", repo=tmp_path, python="py") != before


def test_runtime_provided_distributions_are_dropped(tmp_path: Path) -> None:
    py = tmp_path / "python"
    for name, top in (("botocore-1.0.0", "botocore"), ("numpy-2.0.0", "numpy")):
        (py / top).mkdir(parents=True)
        (py / top / "__init__.py").write_text("")
        info = py / f"{name}.dist-info"
        info.mkdir()
        (info / "RECORD").write_text(f"{top}/__init__.py,sha256=x,0\n{name}.dist-info/RECORD,,\n")
    builder._drop_runtime_provided(py, log=lambda _m: None)
    assert sorted(p.name for p in py.iterdir()) == ["numpy", "numpy-2.0.0.dist-info"]


def test_local_bundler_copies_the_cached_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cached = tmp_path / "cache" / "x86_64-py312-abc"
    (cached / "python" / "trainguard").mkdir(parents=True)
    (cached / "python" / "trainguard" / "__init__.py").write_text("VERSION = 1\n")
    calls: list[str] = []
    monkeypatch.setattr(builder, "build_layer", lambda arch: calls.append(arch) or cached)
    out = tmp_path / "asset"
    out.mkdir()
    assert LocalLayerBundling("x86_64").try_bundle(str(out), None) is True
    assert calls == ["x86_64"]
    assert (out / "python" / "trainguard" / "__init__.py").read_text() == "VERSION = 1\n"


@pytest.mark.slow
def test_real_layer_build_imports_on_cpython312(tmp_path: Path) -> None:
    """pip --platform for the host architecture, then import it with a real 3.12 interpreter."""
    python = builder.find_python()
    if python is None:
        pytest.skip("no python3.12 on this machine to import the layer with")
    arch = builder.host_arch()
    # a frozen copy of the package sources: the cache key must not move under the test
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "shared" / "trainguard", repo / "shared" / "trainguard")
    shutil.copy2(REPO / "pyproject.toml", repo / "pyproject.toml")
    layer = builder.build_layer(arch, repo=repo, cache=tmp_path / "cache", log=lambda _m: None)
    assert (layer / ".complete").exists()
    py = layer / "python"
    for name in ("numpy", "pydantic", "pydantic_core", "aws_lambda_powertools", "trainguard"):
        assert (py / name).is_dir(), name
    assert not (py / "botocore").exists()  # the runtime's own
    assert builder.dir_size(py) < builder.MAX_LAYER_BYTES
    # .pyc for 3.12, hash-based and unchecked: valid despite the zip's fixed timestamps
    pyc = next((py / "trainguard" / "__pycache__").glob("__init__.cpython-312.pyc"))
    flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
    assert flags == 0b01
    assert builder.check_layer(layer, python).startswith("ok numpy")
    # cached: a second call returns the same folder without pip
    assert builder.build_layer(arch, repo=repo, cache=tmp_path / "cache", log=pytest.fail) == layer
