"""smdebug's Hook API on top of trainguard's: the methods, the current hook, the constructor's notes.

``SmdebugMethods`` is a base class of ``Hook``: smdebug's method names and semantics, written
on the hook's public interface (``save_scalar``, ``save_tensor``, ``collections_for``,
``register_module``, ``get_collection``...). ``get_hook``/``del_hook`` keep smdebug's
"current hook" (the one created last in the process), which smdebug's scripts reach for
from inside their models (``get_hook().get_collection(...).add_module_tensors(...)``).
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Any, cast

from trainguard.hook import env
from trainguard.hook.config import Collection, CollectionKeys, default_collection, is_loss_name
from trainguard.hook.values import numel

if TYPE_CHECKING:
    from trainguard.hook.core import Hook


class SmdebugMethods:
    """smdebug's ``Hook`` methods (see docs/hook.md for what differs, and why)."""

    @classmethod
    def create_from_json_file(cls, json_file_path: str | os.PathLike[str] | None = None) -> Hook | None:
        """A hook from SageMaker's hook configuration (smdebug's ``create_from_json_file``).

        ``json_file_path`` None: ``SMDEBUG_CONFIG_FILE_PATH`` or
        ``/opt/ml/input/config/debughookconfig.json``, and None is returned when that file does
        not exist; a path that is given must exist. The mapping is
        ``trainguard.hook.sagemaker.hook_settings``.
        """
        from trainguard.hook.sagemaker import hook_settings, load_hook_config

        path = os.fspath(json_file_path) if json_file_path is not None else env.sagemaker_hook_config_path()
        config = load_hook_config(path, missing_ok=json_file_path is None)
        if config is None:
            return None
        settings = hook_settings(config, job_name=env.sagemaker_training_job_name())
        hook: Hook = cls(**settings.kwargs())  # type: ignore[assignment]
        return hook

    def register_hook(self, module: Any) -> None:
        """smdebug's alias of ``register_module``."""
        cast("Hook", self).register_module(module)

    def record_tensor_value(self, tensor_name: str, tensor_value: Any) -> None:
        """Save a value computed outside a registered module (smdebug: ``F.mse_loss(...)``).

        Named ``<tensor_name>_output_0`` as smdebug names it; written at the current step
        into the collections whose regexes match that name (``losses`` for a loss's name),
        as a scalar when it has one element; never dropped for not being due.
        """
        hook = cast("Hook", self)
        hook.guard(_record_value, "record_tensor_value")(hook, str(tensor_name), tensor_value)

    def get_collections(self) -> dict[str, Collection]:
        return dict(cast("Hook", self).collections)

    def add_collection(self, collection: Collection) -> None:
        """Add (or replace) a collection, as if it had been given in ``collections=``."""
        if not isinstance(collection, Collection):
            raise TypeError(f"add_collection needs a trainguard.Collection, got {type(collection).__name__}")
        hook = cast("Hook", self)
        col = collection.copy()
        if col.save_config is None:
            col.save_config = default_collection(col.name).save_config
        hook.collections[col.name] = col
        hook.selection.asked_for(col.name)
        hook.collections_changed()

    def add_to_collection(self, collection_name: str, args: Any) -> None:
        """smdebug's ``add_to_collection``: tensor names join a collection."""
        hook = cast("Hook", self)
        col = hook.get_collection(collection_name)
        items = args if isinstance(args, list | tuple | set) else [args]
        for item in items:
            if isinstance(item, str):
                col.add_tensor_name(item)
        hook.collections_changed()

    def _cleanup(self) -> None:
        """smdebug's name for ``close`` (its tests and scripts call it)."""
        cast("Hook", self).close()


def _record_value(hook: Hook, tensor_name: str, value: Any) -> None:
    name = f"{tensor_name}_output_0"
    cols = list(hook.collections_for(name))
    if not cols and is_loss_name(tensor_name):
        cols = [CollectionKeys.LOSSES]
    if numel(value) == 1 and (not cols or set(cols) & set(CollectionKeys.SCALAR_COLLECTIONS)):
        hook.save_scalar(name, value, collections=cols or None)
    else:
        hook.save_tensor(name, value, collections=cols or [CollectionKeys.DEFAULT])


def reduction_statistics(reduction_config: Any) -> tuple[str, ...] | None:
    """smdebug's hook-wide ``reduction_config`` (object or dict) as TensorStats fields."""
    if reduction_config is None:
        return None
    from trainguard.hook.sagemaker import reduction_statistics as fields

    return fields(reduction_config) or None


def constructor_notes(
    export_tensorboard: bool, tensorboard_dir: str | None, include_workers: str | None
) -> list[str]:
    """What smdebug's constructor arguments do here (the hook says it once, at INFO)."""
    if include_workers not in (None, "one", "all"):
        raise ValueError(f"include_workers must be 'one' or 'all', got {include_workers!r}")
    notes = []
    if export_tensorboard or tensorboard_dir:
        notes.append(
            "export_tensorboard/tensorboard_dir are smdebug's; trainguard writes its own format only"
        )
    if include_workers == "one":
        notes.append("include_workers='one' is smdebug's; every trainguard worker writes its own segments")
    return notes


# ---------------------------------------------------------------------- the current hook
_current: weakref.ReferenceType[Any] | None = None


def set_current(hook: Hook) -> None:
    global _current
    _current = weakref.ref(hook)


def forget_current(hook: Hook) -> None:
    global _current
    if _current is not None and _current() is hook:
        _current = None


def get_hook(json_config_path: str | None = None, create_if_not_exists: bool = False) -> Hook | None:
    """The hook created last in this process (smdebug's ``get_hook``), or None.

    With ``create_if_not_exists``: one is created from SageMaker's hook configuration
    (``Hook.create_from_json_file``) when there is one, else from the environment (``Hook()``).
    """
    from trainguard.hook.core import Hook

    hook: Hook | None = _current() if _current is not None else None
    if hook is None and create_if_not_exists:
        if json_config_path or os.path.exists(env.sagemaker_hook_config_path()):
            hook = Hook.create_from_json_file(json_config_path)
        if hook is None:
            hook = Hook()
    return hook


def del_hook() -> None:
    """Forget the current hook (smdebug's ``del_hook``); it is not closed."""
    global _current
    _current = None
