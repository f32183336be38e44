"""SageMaker's hook configuration (``DebugHookConfig``) as trainguard Hook settings, in one pure function.

SageMaker writes a training job's ``DebugHookConfig`` (of CreateTrainingJob, or the SDK's
``DebuggerHookConfig``) to ``/opt/ml/input/config/debughookconfig.json``; smdebug's
``Hook.create_from_json_file`` reads it. ``hook_settings(config)`` maps the same document,
or the ``DebugHookConfig`` of a CreateTrainingJob request, to ``HookSettings``, whose
``kwargs()`` are ``trainguard.Hook`` arguments::

    {"S3OutputPath": "s3://bucket/jobs",                 -> out_dir s3://bucket/jobs/<job>
     "LocalPath": "/opt/ml/output/tensors",              -> out_dir when there is no S3OutputPath
     "HookParameters": {"save_interval": "100",          -> save_config (per mode: "train.save_interval")
                        "save_steps": "1,2,3", "start_step": "1", "end_step": "50",
                        "include_regex": "fc1.*,relu.*", -> include_regex
                        "save_all": "false",             -> save_all
                        "reductions": "mean,abs_max"},   -> statistics of every collection
     "CollectionConfigurations": [                       -> collections (and include_collections)
        {"CollectionName": "gradients",
         "CollectionParameters": {"save_interval": "10", "include_regex": "...", "reductions": "..."}}]}

As in smdebug, a configured collection without ``reductions`` saves its tensors in full
(``Collection.save_full``), one with ``reductions`` saves those statistics.

Values may be strings (the API's type) or numbers (smdebug's JSON examples). Parameters
that configure only smdebug's own outputs (``export_tensorboard``, ``tensorboard_dir``,
``save_histogram``, ``include_workers``, ``save_shape``, ``prod``/``sum`` reductions without a
trainguard statistic) are accepted, listed in ``HookSettings.ignored`` and have no effect.
An unknown key or a bad value is a ``ValueError`` that names it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard.hook.config import Collection, CollectionKeys, SaveConfig, SaveConfigMode
from trainguard.modes import ModeKeys

#: a hook config is a few KiB; anything far larger is not one
MAX_CONFIG_BYTES = 1024 * 1024
DEFAULT_LOCAL_PATH = "/opt/ml/output/tensors"
_SAVE_KEYS = ("save_interval", "save_steps", "start_step", "end_step")
_MODE_PREFIXES = {
    "train.": ModeKeys.TRAIN,
    "eval.": ModeKeys.EVAL,
    "predict.": ModeKeys.PREDICT,
    "global.": ModeKeys.GLOBAL,
}
_IGNORED_KEYS = {
    "export_tensorboard": "TensorBoard export is smdebug's; trainguard writes its own format",
    "tensorboard_dir": "TensorBoard export is smdebug's; trainguard writes its own format",
    "save_histogram": "TensorBoard histograms are smdebug's (ours: Collection.histogram_bins)",
    "include_workers": "every trainguard worker writes its own segments",
    "save_shape": "trainguard always records shapes",
    "dry_run": "use Hook(dry_run=True) in the script",
    "norms": "read through 'reductions' (l1/l2 norms are always available)",
    "abs_reductions": "read through 'reductions'",
    "abs_norms": "read through 'reductions'",
}
#: smdebug reduction names -> TensorStats fields
_REDUCTIONS = {
    "min": ("min",),
    "max": ("max",),
    "mean": ("mean",),
    "std": ("std",),
    "variance": ("std",),
    "sum": ("mean", "numel"),
    "l1": ("l1",),
    "l2": ("l2",),
    "l1_norm": ("l1",),
    "l2_norm": ("l2",),
    "abs_mean": ("mean_abs",),
    "abs_min": ("min", "max"),
    "abs_max": ("min", "max"),
    "abs_sum": ("l1",),
    "abs_l1_norm": ("l1",),
    "abs_l2_norm": ("l2",),
    "abs_l1": ("l1",),
    "abs_l2": ("l2",),
    "abs_variance": ("std",),
    "abs_std": ("std",),
}


@dataclass
class HookSettings:
    """``trainguard.Hook`` arguments from a SageMaker hook configuration."""

    out_dir: str | None = None
    job_name: str | None = None
    save_config: SaveConfig | None = None
    include_regex: list[str] | None = None
    include_collections: list[str] | None = None
    collections: list[Collection] = field(default_factory=list)
    save_all: bool = False
    #: key -> why it has no effect here
    ignored: dict[str, str] = field(default_factory=dict)

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``trainguard.Hook`` (``out_dir`` only when known)."""
        out: dict[str, Any] = {
            "save_config": self.save_config,
            "include_regex": self.include_regex,
            "include_collections": self.include_collections,
            "collections": self.collections or None,
            "save_all": self.save_all,
        }
        if self.out_dir is not None:
            out["out_dir"] = self.out_dir
        if self.job_name is not None:
            out["job_name"] = self.job_name
        return out


def load_hook_config(path: str | os.PathLike[str], *, missing_ok: bool = False) -> dict[str, Any] | None:
    """Read a ``debughookconfig.json`` (bounded size); None when missing and ``missing_ok``."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise FileNotFoundError(f"no SageMaker hook configuration at {os.fspath(path)}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"{os.fspath(path)}: larger than {MAX_CONFIG_BYTES} bytes: not a hook configuration")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{os.fspath(path)} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{os.fspath(path)}: a hook configuration is a JSON object")
    return doc


def sagemaker_out_dir(config: Mapping[str, Any], job_name: str | None) -> str | None:
    """``<S3OutputPath>/<job>`` (the path itself if it already ends with the job's name), else None."""
    s3 = config.get("S3OutputPath")
    if not isinstance(s3, str) or not s3.startswith("s3://"):
        return None
    base = s3.rstrip("/")
    if not job_name or base.rsplit("/", 1)[-1] == job_name:
        return base
    return f"{base}/{job_name}"


def hook_settings(config: Mapping[str, Any], *, job_name: str | None = None) -> HookSettings:
    """Map a SageMaker hook configuration (``DebugHookConfig``) to ``HookSettings``.

    ``job_name``: the training job (SageMaker's ``TRAINING_JOB_NAME``); the job folder is
    ``<S3OutputPath>/<job_name>``. Without ``S3OutputPath`` the ``LocalPath`` is used (a
    local folder: SageMaker uploads it at the end, so rules see the job only then).
    """
    if not isinstance(config, Mapping):
        raise ValueError("a hook configuration is a JSON object (DebugHookConfig)")
    known = {"S3OutputPath", "LocalPath", "HookParameters", "CollectionConfigurations"}
    unknown = sorted(set(config) - known - {"S3Path"})
    if unknown:
        raise ValueError(f"unknown DebugHookConfig keys {unknown}; expected {sorted(known)}")
    settings = HookSettings(job_name=job_name)
    if "S3Path" in config:  # smdebug's own test configurations carry it; smdebug ignores it
        settings.ignored["S3Path"] = (
            "not a DebugHookConfig key (SageMaker's is S3OutputPath); ignored as smdebug does"
        )
    settings.out_dir = sagemaker_out_dir(config, job_name)
    if settings.out_dir is None:
        local = config.get("LocalPath")
        if config.get("S3OutputPath") not in (None, ""):
            raise ValueError(f"S3OutputPath must be an s3:// URL, got {config.get('S3OutputPath')!r}")
        if local is not None and not isinstance(local, str):
            raise ValueError("LocalPath must be a string")
        settings.out_dir = (local or DEFAULT_LOCAL_PATH).rstrip("/") + (f"/{job_name}" if job_name else "")
    hook_params = _params(config.get("HookParameters"), "HookParameters")
    own_modes = _save_modes(hook_params, "HookParameters")
    base_modes = _resolve({m: {} for m in ModeKeys}, own_modes)
    if own_modes:
        settings.save_config = SaveConfig(mode_save_configs=_mode_configs(base_modes))
    if "include_regex" in hook_params:
        settings.include_regex = _split(hook_params["include_regex"])
    if "save_all" in hook_params:
        settings.save_all = _bool(hook_params["save_all"], "HookParameters.save_all")
    statistics = _statistics(hook_params, "HookParameters", settings.ignored)
    _note_ignored(hook_params, "HookParameters", settings.ignored)
    entries = config.get("CollectionConfigurations")
    if entries is not None:
        if not isinstance(entries, list):
            raise ValueError("CollectionConfigurations must be a list")
        names: list[str] = []
        for index, entry in enumerate(entries):
            where = f"CollectionConfigurations[{index}]"
            if not isinstance(entry, Mapping) or not isinstance(entry.get("CollectionName"), str):
                raise ValueError(f"{where} needs a CollectionName")
            extra = sorted(set(entry) - {"CollectionName", "CollectionParameters"})
            if extra:
                raise ValueError(f"{where}: unknown keys {extra}")
            name = entry["CollectionName"]
            params = _params(entry.get("CollectionParameters"), f"{where}.CollectionParameters")
            modes = _save_modes(params, where)
            col = Collection(name)
            if modes or own_modes:
                col.save_config = SaveConfig(mode_save_configs=_mode_configs(_resolve(base_modes, modes)))
            if "include_regex" in params:
                col.include(_split(params["include_regex"]))
            own = _statistics(params, where, settings.ignored)
            if own is not None or statistics is not None:
                col.statistics = tuple(own if own is not None else statistics or ())
            else:
                col.save_full = True  # no reductions: smdebug (and SageMaker) save the tensor itself
            _note_ignored(params, where, settings.ignored)
            settings.collections.append(col)
            names.append(name)
        settings.include_collections = list(dict.fromkeys([CollectionKeys.LOSSES, *names]))
    elif statistics is not None:
        settings.ignored["HookParameters.reductions"] = (
            "applies to the collections this configuration names; it names none"
        )
    return settings


def _params(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be an object of string values")
    return {str(k): v for k, v in value.items()}


def _save_modes(params: Mapping[str, Any], where: str) -> dict[ModeKeys | None, dict[str, Any]]:
    """{None: the plain save values, mode: that mode's ("train.save_interval")}."""
    out: dict[ModeKeys | None, dict[str, Any]] = {}
    for key, value in params.items():
        mode: ModeKeys | None = None
        name = key
        for prefix, m in _MODE_PREFIXES.items():
            if key.startswith(prefix):
                mode, name = m, key[len(prefix) :]
                break
        if name not in _SAVE_KEYS:
            continue
        out.setdefault(mode, {})[name] = _save_value(name, value, f"{where}.{key}")
    return out


def _resolve(
    base: Mapping[ModeKeys, dict[str, Any]], own: Mapping[ModeKeys | None, dict[str, Any]]
) -> dict[ModeKeys, dict[str, Any]]:
    """Per mode: ``base``'s values, then ``own`` plain values, then ``own``'s for that mode
    (smdebug's precedence: a collection's values beat the hook's, a mode's beat plain ones)."""
    plain = own.get(None, {})
    return {m: {**base.get(m, {}), **plain, **own.get(m, {})} for m in ModeKeys}


def _mode_configs(
    modes: Mapping[ModeKeys, dict[str, Any]],
) -> dict[ModeKeys | str, SaveConfigMode | Mapping[str, Any]]:
    return {m: SaveConfigMode(**modes.get(m, {})) for m in ModeKeys}


def _save_value(name: str, value: Any, where: str) -> Any:
    if name == "save_steps":
        try:
            return [int(s) for s in _split(value)]
        except ValueError:
            raise ValueError(f"{where}: save_steps must be comma-separated integers, got {value!r}") from None
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{where}: {name} must be an integer, got {value!r}") from None
    if number < (1 if name == "save_interval" else 0):
        raise ValueError(f"{where}: {name} must be {'positive' if name == 'save_interval' else '>= 0'}")
    return number


def _statistics(params: Mapping[str, Any], where: str, ignored: dict[str, str]) -> tuple[str, ...] | None:
    if "reductions" not in params:
        return None
    fields: list[str] = []
    for item in _split(params["reductions"]):
        mapped = _REDUCTIONS.get(item.lower())
        if mapped is None:
            ignored[f"{where}.reductions:{item}"] = "no trainguard statistic corresponds to this reduction"
            continue
        fields.extend(f for f in mapped if f not in fields)
    return tuple(fields)


def reduction_statistics(config: Any) -> tuple[str, ...]:
    """smdebug's ``ReductionConfig`` (object or dict) as ``TensorStats`` fields."""
    names: list[str] = []
    for attr in ("reductions", "abs_reductions", "norms", "abs_norms"):
        items = config.get(attr) if isinstance(config, Mapping) else getattr(config, attr, None)
        for item in items or ():
            key = str(item).lower()
            if attr.endswith("norms") and not key.endswith("_norm"):
                key += "_norm"
            if attr.startswith("abs") and not key.startswith("abs_"):
                key = "abs_" + key
            names.extend(f for f in _REDUCTIONS.get(key, ()) if f not in names)
    return tuple(names)


def _note_ignored(params: Mapping[str, Any], where: str, ignored: dict[str, str]) -> None:
    for key in params:
        bare = key.split(".", 1)[1] if key.split(".", 1)[0] + "." in _MODE_PREFIXES else key
        if bare in _SAVE_KEYS or bare in ("include_regex", "save_all", "reductions"):
            continue
        if bare in _IGNORED_KEYS:
            ignored[f"{where}.{key}"] = _IGNORED_KEYS[bare]
        else:
            raise ValueError(
                f"{where}: unknown parameter {key!r}; known: "
                f"{sorted([*_SAVE_KEYS, 'include_regex', 'save_all', 'reductions', *_IGNORED_KEYS])}"
            )


def _split(value: Any) -> list[str]:
    if isinstance(value, list | tuple):
        return [str(v).strip() for v in value if str(v).strip()]
    return [part.strip() for part in str(value).split(",") if part.strip()]


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ValueError(f"{where} must be true or false, got {value!r}")
