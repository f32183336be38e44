"""The custom-rules Lambda layer (``ruleModules``): the user's rule folders as ``python/``.

Pure-Python rules need no pip and no Docker: each folder is copied into ``python/`` (Lambda
extracts it to ``/opt/python``, next to the trainguard layer), byte-compiled like the
trainguard layer (``unchecked-hash`` .pyc, when a python3.12 is found) and cached under
``layers/build/rules/<key>/`` by a hash of the folders' contents. ``check_rule_layer``
imports the modules from the built folder in a fresh interpreter and validates every rule
class (``trainguard.rules.plugins``): a module that cannot load fails ``cdk synth``.

A rule's third-party imports must be in its folder (vendored) or in the trainguard layer
(numpy, pydantic); the check runs with the synth environment's packages, so it cannot
prove that by itself.
"""

from __future__ import annotations

import fnmatch
import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from infra.config import RuleModuleSource
from infra.layer import builder

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / "layers" / "build" / "rules"
#: bump when the layout of the built folder changes
FORMAT = "1"
#: never copied from a rule folder
IGNORED = (
    "__pycache__",
    "*.pyc",
    "*.pyo",
    ".*",  # .git, .venv, .pytest_cache, .mypy_cache, .DS_Store ...
    "venv",
    "node_modules",
    "*.egg-info",
    "cdk.out",
)
#: top-level names of the trainguard layer (and the runtime): a rule folder holding one would
#: overwrite it in /opt/python, where Lambda merges every layer
RESERVED = frozenset(
    {
        "trainguard",
        "numpy",
        "numpy.libs",
        "pydantic",
        "pydantic_core",
        "annotated_types",
        "typing_extensions",
        "typing_inspection",
        "aws_lambda_powertools",
        "aws_xray_sdk",
        "wrapt",
        "jsonpickle",
        "boto3",
        "botocore",
        "python",
    }
)
#: plenty for rule code; a folder this large is almost certainly the wrong folder
MAX_BYTES = 20 * 1024 * 1024
_COMPLETE = ".complete"
KEEP_BUILDS = 5


class RuleLayerError(ValueError):
    """The custom rules cannot be packaged or do not load."""


def _ignored(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in IGNORED)


def rule_files(folder: Path) -> list[Path]:
    """The files of ``folder`` that go into the layer, relative to it, sorted."""
    out: list[Path] = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(_ignored(part) for part in rel.parts) or not path.is_file() or path.is_symlink():
            continue
        out.append(rel)
    return out


def _top_level(rel: Path) -> str:
    first = rel.parts[0]
    return first[: -len(".py")] if len(rel.parts) == 1 and first.endswith(".py") else first


def _check_names(sources: Sequence[RuleModuleSource]) -> dict[Path, list[Path]]:
    files: dict[Path, list[Path]] = {}
    owner: dict[str, Path] = {}
    for source in sources:
        if source.folder in files:
            continue
        listed = rule_files(source.folder)
        for name in sorted({_top_level(rel) for rel in listed}):
            if name in RESERVED:
                raise RuleLayerError(
                    f"ruleModules: {source.folder} holds {name!r}, which would overwrite the trainguard "
                    "layer's copy in /opt/python; move your rules into their own package"
                )
            if name in owner:
                raise RuleLayerError(f"ruleModules: {name!r} is in both {owner[name]} and {source.folder}")
            owner[name] = source.folder
        files[source.folder] = listed
    return files


def rule_layer_key(sources: Sequence[RuleModuleSource], python: str | None) -> str:
    """A hash of everything the built folder depends on: the files, the compiler, the format."""
    digest = hashlib.sha256(f"{FORMAT}|{builder.PYTHON_VERSION if python else 'no-pyc'}".encode())
    for folder, listed in _check_names(sources).items():
        for rel in listed:
            digest.update(f"\0{rel.as_posix()}\0".encode())
            digest.update((folder / rel).read_bytes())
    return digest.hexdigest()[:16]


def build_rule_layer(
    sources: Sequence[RuleModuleSource],
    *,
    cache: Path | None = None,
    python: str | None = None,
    compile_pyc: bool = True,
) -> Path:
    """A folder holding ``python/`` with every source folder's files, built once per content."""
    if not sources:
        raise RuleLayerError("no rule modules to package")
    cache = CACHE if cache is None else cache
    python = (python or builder.find_python()) if compile_pyc else None
    files = _check_names(sources)
    key = rule_layer_key(sources, python)
    final = cache / key
    if (final / _COMPLETE).exists():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=cache))
    try:
        py_dir = tmp / "python"
        py_dir.mkdir()
        for folder, listed in files.items():
            for rel in listed:
                (py_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(folder / rel, py_dir / rel)
        size = builder.dir_size(py_dir)
        if size > MAX_BYTES:
            raise RuleLayerError(
                f"ruleModules: the rule folders hold {size / 2**20:.1f} MiB, over {MAX_BYTES / 2**20:.0f} MiB"
            )
        if python:
            builder._compile(py_dir, python, builder._stderr)
        (tmp / _COMPLETE).write_text(f"{key}\n")
        if final.exists():
            shutil.rmtree(final)
        try:
            tmp.rename(final)
        except OSError:
            if not (final / _COMPLETE).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(cache)
    return final


def _prune(cache: Path) -> None:
    builds = [p for p in cache.iterdir() if (p / _COMPLETE).exists()]
    builds.sort(key=lambda p: (p / _COMPLETE).stat().st_mtime, reverse=True)
    for old in builds[KEEP_BUILDS:]:
        shutil.rmtree(old, ignore_errors=True)


def check_rule_layer(layer_dir: Path, modules: Sequence[str], python: str = sys.executable) -> list[str]:
    """Import ``modules`` from the built layer in a fresh interpreter and validate their rules.

    Returns the custom rule names; raises ``RuleLayerError`` with the loader's message.
    """
    py_dir = str((layer_dir / "python").resolve())
    code = (
        "import sys\n"
        f"sys.path.insert(0, {py_dir!r})\n"
        "from trainguard.rules.plugins import PluginError, load_plugins\n"
        "try:\n"
        f"    plugins = load_plugins({list(modules)!r}, strict=True)\n"
        "except PluginError as exc:\n"
        "    print(exc, file=sys.stderr)\n"
        "    sys.exit(3)\n"
        "print(','.join(plugins.origins))\n"
    )
    # -I: the caller's PYTHONPATH and user site cannot make a module importable here by accident;
    # -B: no .pyc of the synth interpreter lands in the cached (content-hashed) layer folder
    proc = subprocess.run(
        [python, "-I", "-B", "-c", code], capture_output=True, text=True, check=False, cwd=py_dir, timeout=120
    )
    if proc.returncode != 0:
        detail = proc.stderr.strip() if proc.returncode == 3 else (proc.stdout + proc.stderr).strip()[-3000:]
        raise RuleLayerError(f"ruleModules: the custom rules do not load, so synth stops:\n{detail}")
    return [name for name in proc.stdout.strip().split(",") if name]
