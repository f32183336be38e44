"""The shared Lambda layer as a CDK asset, bundled locally (no Docker) by layers/build_layer.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_

REPO = Path(__file__).resolve().parent.parent
LAYERS = REPO / "layers"
#: required by BundlingOptions, never pulled: the local bundler either builds or raises
_UNUSED_IMAGE = "public.ecr.aws/sam/build-python3.12"


def _load_builder() -> ModuleType:
    name = "trainguard_build_layer"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, LAYERS / "build_layer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


builder = _load_builder()

ARCHITECTURES = {"x86_64": lambda_.Architecture.X86_64, "arm64": lambda_.Architecture.ARM_64}


@jsii.implements(ILocalBundling)
class LocalLayerBundling:
    """``try_bundle`` runs the pip build (or reuses its cache) and copies ``python/`` out."""

    def __init__(self, arch: str) -> None:
        self.arch = arch

    def try_bundle(self, output_dir: str, options: Any) -> bool:
        layer = builder.build_layer(self.arch)
        builder.copy_layer(layer, Path(output_dir))
        return True


def layer_code(arch: str, prebuilt: Path | None = None) -> lambda_.Code:
    """The layer's code: a prebuilt folder (tests) or the cached pip build, hashed by its inputs."""
    if prebuilt is not None:
        return lambda_.Code.from_asset(str(prebuilt))
    key = builder.layer_key(arch, python=builder.find_python())
    return lambda_.Code.from_asset(
        str(LAYERS),
        # the hash of the build inputs: CDK skips bundling when cdk.out already has this asset
        asset_hash=f"trainguard-layer-{arch}-{key}",
        asset_hash_type=AssetHashType.CUSTOM,
        bundling=BundlingOptions(
            image=DockerImage.from_registry(_UNUSED_IMAGE), local=LocalLayerBundling(arch)
        ),
    )
