#!/usr/bin/env python3
"""Build the trainguard Lambda layer without Docker, and cache it by a hash of its inputs.

The layer is ``python/`` with numpy, pydantic and aws-lambda-powertools (binary wheels for
CPython 3.12 on Amazon Linux 2023, fetched with ``pip --platform``) and the local
``trainguard`` package (pure Python, ``--no-deps``), byte-compiled for 3.12 with
``--invalidation-mode unchecked-hash``: CDK zips assets with a fixed timestamp, so
timestamp-checked ``.pyc`` files would be stale on Lambda and recompiled (in memory, since
``/opt`` is read-only) at every cold start.

The CDK stack calls :func:`build_layer` from a local bundler during synth; run it alone to
warm the cache or to inspect the layer::

    .venv/bin/python layers/build_layer.py --arch x86_64 --check
    .venv/bin/python layers/build_layer.py --print-key

Builds live in ``layers/build/<arch>-py312-<key>/`` (git-ignored). The key covers
``layers/requirements.txt``, this script, the architecture, the Python version, whether a
3.12 interpreter was found to compile with, ``pyproject.toml`` and every file of
``shared/trainguard``: change any of them and the next synth rebuilds; otherwise synth
reuses the build in well under a second.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CACHE = HERE / "build"
REQUIREMENTS = HERE / "requirements.txt"

PYTHON_VERSION = "3.12"
#: Lambda's python3.12 runtime is Amazon Linux 2023 (glibc 2.34). Both tags are needed:
#: with manylinux2014 alone pip silently picks an old numpy.
PLATFORMS: dict[str, tuple[str, ...]] = {
    "x86_64": ("manylinux_2_28_x86_64", "manylinux2014_x86_64"),
    "arm64": ("manylinux_2_28_aarch64", "manylinux2014_aarch64"),
}
#: Lambda allows 250 MB unzipped for a function and all its layers; leave room for code.
MAX_LAYER_BYTES = 200 * 1024 * 1024
#: complete builds kept per architecture (older ones are pruned)
KEEP_BUILDS = 3
#: what the import check loads from the layer
SMOKE_IMPORTS = (
    "numpy",
    "pydantic",
    "pydantic_core",
    "aws_lambda_powertools",
    "aws_xray_sdk",
    "trainguard",
    "trainguard.wiring",
)
#: distributions the Lambda Python runtime already ships (pulled in here by aws-xray-sdk):
#: a second copy in /opt/python would shadow the runtime's botocore and could mismatch its boto3
RUNTIME_PROVIDED = frozenset(
    {"boto3", "botocore", "s3transfer", "jmespath", "python_dateutil", "six", "urllib3"}
)
_COMPLETE = ".complete"

Log = Callable[[str], None]


class LayerBuildError(RuntimeError):
    """The layer could not be built (pip failed, no wheel for the platform, too large)."""


def _stderr(msg: str) -> None:
    print(f"[trainguard layer] {msg}", file=sys.stderr, flush=True)


def _is_python(candidate: str, version: str) -> bool:
    try:
        proc = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and proc.stdout.strip() == version


def find_python(version: str = PYTHON_VERSION) -> str | None:
    """An interpreter of ``version`` to byte-compile with: $TRAINGUARD_LAYER_PYTHON, PATH, pyenv."""
    pyenv_root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates = [os.environ.get("TRAINGUARD_LAYER_PYTHON"), shutil.which(f"python{version}")]
    candidates += sorted(
        glob.glob(os.path.join(pyenv_root, "versions", f"{version}.*", "bin", f"python{version}")),
        reverse=True,
    )
    # a pyenv shim on PATH exists but may fail for an inactive version: run each candidate
    return next((c for c in candidates if c and _is_python(c, version)), None)


def _package_files(repo: Path) -> Iterable[Path]:
    root = repo / "shared" / "trainguard"
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in {".pyc", ".pyo"}:
            yield path


def layer_key(arch: str, *, repo: Path = REPO, python: str | None = None) -> str:
    """A short hash of everything that goes into the layer."""
    if arch not in PLATFORMS:
        raise ValueError(f"unknown architecture {arch!r}: use one of {sorted(PLATFORMS)}")
    h = hashlib.sha256()

    def feed(label: str, data: bytes) -> None:
        h.update(label.encode() + b"\0" + hashlib.sha256(data).digest())

    feed("arch", arch.encode())
    feed("python", PYTHON_VERSION.encode())
    feed("compiled", b"1" if python else b"0")
    feed("script", Path(__file__).read_bytes())
    feed("requirements", REQUIREMENTS.read_bytes())
    feed("pyproject", (repo / "pyproject.toml").read_bytes())
    for path in _package_files(repo):
        feed(str(path.relative_to(repo)), path.read_bytes())
    return h.hexdigest()[:16]


def _run(cmd: list[str], log: Log) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LayerBuildError(
            f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
        )


def _pip_third_party(py_dir: Path, arch: str, log: Log) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
    cmd += ["--target", str(py_dir), "--only-binary=:all:", "--implementation", "cp"]
    cmd += ["--python-version", PYTHON_VERSION]
    for tag in PLATFORMS[arch]:
        cmd += ["--platform", tag]
    cmd += ["-r", str(REQUIREMENTS)]
    log(f"pip install third-party wheels for cp312/{arch}")
    _run(cmd, log)


def _pip_trainguard(py_dir: Path, repo: Path, log: Log) -> None:
    """Install the local package from a clean copy of its sources (no stale build/ in the repo)."""
    with tempfile.TemporaryDirectory(prefix="tg-src-") as tmp:
        src = Path(tmp)
        shutil.copy2(repo / "pyproject.toml", src / "pyproject.toml")
        readme = repo / "README.md"
        (src / "README.md").write_text(readme.read_text() if readme.exists() else "trainguard\n")
        shutil.copytree(
            repo / "shared" / "trainguard",
            src / "shared" / "trainguard",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-compile",
        ]
        cmd += ["--no-deps", "--target", str(py_dir)]
        try:
            import setuptools  # noqa: F401
            import wheel  # noqa: F401

            cmd.append("--no-build-isolation")  # build with the installed setuptools: faster, offline
        except ImportError:
            pass
        log("pip install trainguard (--no-deps)")
        _run([*cmd, str(src)], log)


def _drop_runtime_provided(py_dir: Path, log: Log) -> None:
    for dist_info in sorted(py_dir.glob("*.dist-info")):
        name = (
            dist_info.name.removesuffix(".dist-info")
            .rsplit("-", 1)[0]
            .lower()
            .replace("-", "_")
            .replace(".", "_")
        )
        if name not in RUNTIME_PROVIDED:
            continue
        record = dist_info / "RECORD"
        for line in record.read_text().splitlines() if record.exists() else ():
            rel = line.rsplit(",", 2)[0]
            target = (py_dir / rel).resolve()
            if target.is_relative_to(py_dir.resolve()) and target.is_file():
                target.unlink()
        shutil.rmtree(dist_info, ignore_errors=True)
        log(f"dropped {name} (the Lambda runtime provides it)")
    # folders emptied by the removals
    for path in sorted(py_dir.rglob("*"), reverse=True):
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def _strip(py_dir: Path) -> None:
    shutil.rmtree(py_dir / "bin", ignore_errors=True)
    for path in sorted(py_dir.rglob("*"), reverse=True):
        if not path.is_dir():
            continue
        if path.name == "__pycache__" or (path.name == "tests" and "trainguard" not in path.parts):
            shutil.rmtree(path, ignore_errors=True)


def _compile(py_dir: Path, python: str | None, log: Log) -> None:
    if not python:
        log(
            f"WARNING: no python{PYTHON_VERSION} found (set TRAINGUARD_LAYER_PYTHON): the layer ships "
            "without .pyc files and cold starts will be slower"
        )
        return
    log(f"byte-compiling with {python}")
    cmd = [python, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash", str(py_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        # a file that does not compile is not imported either; the import check catches real damage
        log(f"WARNING: compileall reported errors:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _prune(cache: Path, arch: str, keep: int) -> None:
    builds = [p for p in cache.glob(f"{arch}-py*-*") if (p / _COMPLETE).exists()]
    builds.sort(key=lambda p: (p / _COMPLETE).stat().st_mtime, reverse=True)
    for old in builds[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    for tmp in cache.glob(".tmp-*"):
        if time.time() - tmp.stat().st_mtime > 3600:
            shutil.rmtree(tmp, ignore_errors=True)


def build_layer(
    arch: str = "x86_64",
    *,
    repo: Path = REPO,
    cache: Path = CACHE,
    force: bool = False,
    log: Log = _stderr,
) -> Path:
    """Return a directory holding the layer's ``python/`` folder, building it if not cached."""
    python = find_python()
    key = layer_key(arch, repo=repo, python=python)
    final = cache / f"{arch}-py{PYTHON_VERSION.replace('.', '')}-{key}"
    if (final / _COMPLETE).exists() and not force:
        return final
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=cache))
    started = time.monotonic()
    try:
        py_dir = tmp / "python"
        py_dir.mkdir()
        _pip_third_party(py_dir, arch, log)
        _pip_trainguard(py_dir, repo, log)
        _drop_runtime_provided(py_dir, log)
        _strip(py_dir)
        _compile(py_dir, python, log)
        size = dir_size(py_dir)
        if size > MAX_LAYER_BYTES:
            raise LayerBuildError(
                f"layer is {size / 2**20:.0f} MiB unzipped, over {MAX_LAYER_BYTES / 2**20:.0f}"
            )
        (tmp / _COMPLETE).write_text(f"{key}\n")
        if final.exists():
            shutil.rmtree(final)
        try:
            tmp.rename(final)
        except OSError:
            if not (final / _COMPLETE).exists():  # not a concurrent build that won the race
                raise
        log(f"built {final.name}: {size / 2**20:.1f} MiB in {time.monotonic() - started:.0f} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(cache, arch, KEEP_BUILDS)
    return final


def copy_layer(src: Path, dest: Path) -> None:
    """Copy a cached build's ``python/`` into ``dest`` (hard links where the filesystem allows)."""

    def link_or_copy(s: str, d: str) -> object:
        try:
            os.link(s, d)
            return d
        except OSError:
            return shutil.copy2(s, d)

    shutil.copytree(src / "python", Path(dest) / "python", copy_function=link_or_copy, dirs_exist_ok=True)


def host_arch() -> str:
    machine = platform.machine().lower()
    return "arm64" if machine in {"aarch64", "arm64"} else "x86_64"


def check_layer(layer_dir: Path, python: str | None = None) -> str:
    """Import the layer's packages with a 3.12 interpreter (same architecture only).

    As on Lambda, the runtime's own boto3/botocore come after the layer on ``sys.path``
    (taken here from the environment running this script: they are pure Python).
    """
    python = python or find_python()
    if not python:
        raise LayerBuildError(f"no python{PYTHON_VERSION} to check the layer with")
    py_dir = (layer_dir / "python").resolve()
    import botocore

    runtime_dir = str(Path(botocore.__file__).resolve().parent.parent)
    code = (
        "import importlib, sys\n"
        f"sys.path.insert(0, {str(py_dir)!r})\n"
        f"sys.path.append({runtime_dir!r})\n"
        f"for name in {SMOKE_IMPORTS!r}:\n"
        "    mod = importlib.import_module(name)\n"
        f"    assert mod.__file__.startswith({str(py_dir)!r}), (name, mod.__file__)\n"
        "import numpy\n"
        "print('ok numpy', numpy.__version__, sys.version.split()[0])\n"
    )
    proc = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LayerBuildError(f"layer import check failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=sorted(PLATFORMS), default="x86_64")
    parser.add_argument("--out", type=Path, help="also copy the layer's python/ into this folder")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--check", action="store_true", help="import the layer with python3.12 (host arch)")
    parser.add_argument("--print-key", action="store_true", help="print the cache key and exit")
    args = parser.parse_args(argv)
    if args.print_key:
        print(layer_key(args.arch, python=find_python()))
        return 0
    layer = build_layer(args.arch, force=args.force)
    print(f"{layer} ({dir_size(layer / 'python') / 2**20:.1f} MiB)")
    if args.out:
        copy_layer(layer, args.out)
    if args.check:
        if args.arch != host_arch():
            print(f"skipping the import check: {args.arch} layer on a {host_arch()} host")
        else:
            print(check_layer(layer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
