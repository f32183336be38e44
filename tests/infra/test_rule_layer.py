"""Custom rules on the stack (``ruleModules``): the second layer, its env var, synth-time checks.

The stack is only constructed (no template synth, which takes seconds): the functions' layer
lists are read from their CloudFormation resources, the environment from the same method the
functions are built with.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from trainguard.wiring import WIRING  # noqa: E402

from infra import rule_layer  # noqa: E402
from infra.app import build_app  # noqa: E402
from infra.config import ConfigError, RuleModuleSource, StackConfig  # noqa: E402
from infra.rule_layer import RuleLayerError, build_rule_layer, check_rule_layer, rule_layer_key  # noqa: E402
from infra.stack import RULE_MODULE_FUNCTIONS, TrainguardStack  # noqa: E402

EXAMPLE = REPO / "examples" / "custom_rule"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Builds go to a temporary cache, not layers/build/rules."""
    path = tmp_path_factory.mktemp("rule-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rule_layer, "CACHE", path)
        yield path


@pytest.fixture(scope="module")
def layer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layer")
    (root / "python" / "trainguard").mkdir(parents=True)
    (root / "python" / "trainguard" / "__init__.py").write_text("")
    return root


def synth(layer_dir: Path, out: Path, rule_modules: str) -> TrainguardStack:
    _app, stack = build_app(
        {"layerAsset": str(layer_dir), "ruleModules": rule_modules},
        outdir=str(out),
        nag=False,
        config_dir=REPO,  # relative DIRs resolve against the repo root, as with `npx cdk`
    )
    return stack


def ref(stack: TrainguardStack, construct: Any) -> dict[str, Any]:
    return {"Ref": stack.resolve(stack.get_logical_id(construct.node.default_child))}


@pytest.fixture(scope="module")
def stack(layer_dir: Path, cache: Path, tmp_path_factory: pytest.TempPathFactory) -> TrainguardStack:
    return synth(layer_dir, tmp_path_factory.mktemp("cdk.out"), "examples/custom_rule:my_rules")


def test_rule_layer_goes_on_the_rule_functions_with_the_module_env(stack: TrainguardStack) -> None:
    assert stack.rule_layer is not None
    main, rules = (ref(stack, x) for x in (stack.layer, stack.rule_layer))
    layer = stack.rule_layer.node.default_child
    assert stack.resolve(layer.compatible_runtimes) == ["python3.12"]
    assert stack.resolve(layer.compatible_architectures) == ["x86_64"]
    assert "my_rules" in stack.resolve(layer.description)
    assert set(RULE_MODULE_FUNCTIONS) <= {f.id for f in WIRING.functions}
    for spec in WIRING.functions:
        layers = stack.resolve(stack.functions[spec.id].node.default_child.layers)
        env = stack.resolve(stack._environment(spec))
        if spec.id in RULE_MODULE_FUNCTIONS:
            assert layers == [main, rules], spec.id
            assert env["TRAINGUARD_RULE_MODULES"] == "my_rules"
        else:
            assert layers == [main], spec.id
            assert "TRAINGUARD_RULE_MODULES" not in env


def test_rule_layer_folder_is_the_package_under_python(stack: TrainguardStack, cache: Path) -> None:
    [built] = [p for p in cache.iterdir() if (p / ".complete").exists()]
    files = sorted(p.relative_to(built).as_posix() for p in built.rglob("*") if p.is_file())
    assert "python/my_rules/__init__.py" in files and "python/my_rules/loss_spike.py" in files
    assert not [f for f in files if "cpython-311" in f or f.startswith("python/trainguard")]
    # content-hashed: the same folder is reused, a change gets a new build
    sources = [RuleModuleSource(EXAMPLE, "my_rules")]
    assert build_rule_layer(sources, cache=cache) == built


def test_key_follows_the_content_not_the_clutter(tmp_path: Path) -> None:
    pkg = tmp_path / "rules_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("RULES = []\n")
    sources = [RuleModuleSource(tmp_path, "rules_pkg")]
    key = rule_layer_key(sources, python=None)
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"x")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref")
    assert rule_layer_key(sources, python=None) == key
    assert rule_layer_key(sources, python="python3.12") != key
    (pkg / "__init__.py").write_text("RULES = []  # changed\n")
    assert rule_layer_key(sources, python=None) != key


BROKEN = {
    "import_error": ("import does_not_exist_anywhere\n", "ModuleNotFoundError"),
    "clash": (
        """
        from trainguard.rules.base import Rule, RuleConfig, RuleState

        class Mine(Rule[RuleConfig, RuleState]):
            name = "Overfit"
            Config = RuleConfig
            State = RuleState

            def update(self, state, step):
                return state, []

        RULES = [Mine]
        """,
        "clashes with a built-in rule",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_rule_module_fails_synth_with_a_clear_message(
    case: str, layer_dir: Path, cache: Path, tmp_path: Path
) -> None:
    body, expected = BROKEN[case]
    (tmp_path / "rules" / "broken_rules").mkdir(parents=True)
    (tmp_path / "rules" / "broken_rules" / "__init__.py").write_text(textwrap.dedent(body))
    with pytest.raises(RuleLayerError) as err:
        synth(layer_dir, tmp_path / "out", f"{tmp_path / 'rules'}:broken_rules")
    text = str(err.value)
    assert "ruleModules: the custom rules do not load" in text
    assert "rule module 'broken_rules'" in text and expected in text


def test_check_ignores_the_callers_pythonpath(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module importable only from the synth environment would not load on Lambda."""
    empty = tmp_path / "layer"
    (empty / "python").mkdir(parents=True)
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLE))
    with pytest.raises(RuleLayerError, match="ModuleNotFoundError"):
        check_rule_layer(empty, ["my_rules"])


def test_rule_folder_may_not_shadow_the_trainguard_layer(tmp_path: Path) -> None:
    (tmp_path / "trainguard").mkdir()
    (tmp_path / "trainguard" / "__init__.py").write_text("")
    (tmp_path / "mine.py").write_text("RULES = []\n")
    with pytest.raises(RuleLayerError, match="would overwrite the trainguard layer"):
        build_rule_layer([RuleModuleSource(tmp_path, "mine")], cache=tmp_path / "cache")


def test_rule_modules_setting_is_parsed_and_validated(tmp_path: Path) -> None:
    cfg = StackConfig.load(
        {"ruleModules": "examples/custom_rule:my_rules, examples/custom_rule:my_rules.loss_spike"}.get,
        REPO,
        environ={},
    )
    assert cfg.rule_modules == (
        RuleModuleSource(EXAMPLE, "my_rules"),
        RuleModuleSource(EXAMPLE, "my_rules.loss_spike"),
    )
    (tmp_path / "trainguard.config.json").write_text(f'{{"ruleModules": ["{EXAMPLE}:my_rules"]}}')
    assert StackConfig.load({}.get, tmp_path, environ={}).rule_modules == (
        RuleModuleSource(EXAMPLE, "my_rules"),
    )
    for bad, message in (
        ("my_rules", "expected DIR:module"),
        ("examples/custom_rule:not a module", "expected DIR:module"),
        ("no/such/dir:my_rules", "no folder"),
        ("examples/custom_rule:other_rules", "has no other_rules/ package or other_rules.py"),
    ):
        with pytest.raises(ConfigError, match=message):
            StackConfig.load({"ruleModules": bad}.get, REPO, environ={})
