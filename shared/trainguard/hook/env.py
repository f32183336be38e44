"""What the hook reads from its environment, in one place.

Rank and world size: ``torch.distributed`` when it is initialised (checked only if torch
is already imported: the hook never imports a framework to find out), else the launcher's
environment: ``RANK``/``WORLD_SIZE`` (torchrun, accelerate), ``OMPI_COMM_WORLD_RANK``/
``OMPI_COMM_WORLD_SIZE`` (Open MPI, Horovod), ``SLURM_PROCID``/``SLURM_NTASKS`` (srun).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

_RANK_VARS = (
    ("RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
)


def rank_and_world(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """This process's (rank, world size); (0, 1) for a single process."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank()), int(dist.get_world_size())
        except Exception:  # noqa: S110 - a broken distributed setup must not break the hook
            pass
    env = os.environ if environ is None else environ
    for rank_var, size_var in _RANK_VARS:
        rank, size = env.get(rank_var), env.get(size_var)
        if rank is not None and size is not None:
            try:
                r, s = int(rank), int(size)
            except ValueError:
                continue
            if s >= 1 and 0 <= r < s:
                return r, s
    return 0, 1


def sagemaker_training_job_name(environ: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    name = env.get("TRAINING_JOB_NAME")
    return name[:256] if name else None


#: the job folder, set by ``trainguard local`` (and by whoever wants ``Hook()`` without arguments)
OUT_DIR_VAR = "TRAINGUARD_OUT_DIR"
#: SageMaker writes the DebugHookConfig of CreateTrainingJob here (smdebug reads the same file)
SAGEMAKER_HOOK_CONFIG = "/opt/ml/input/config/debughookconfig.json"
SAGEMAKER_HOOK_CONFIG_VAR = "SMDEBUG_CONFIG_FILE_PATH"


class OutDirMissing(ValueError):
    """``Hook()`` was given no ``out_dir`` and the environment names none."""


def sagemaker_hook_config_path(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get(SAGEMAKER_HOOK_CONFIG_VAR) or SAGEMAKER_HOOK_CONFIG


def resolve_out_dir(environ: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """``(out_dir, job_name)`` for a ``Hook()`` created without ``out_dir``.

    1. ``TRAINGUARD_OUT_DIR`` (``trainguard local`` sets it; so can an estimator's
       ``environment=``); the job name is its last component.
    2. On SageMaker (``TRAINING_JOB_NAME`` is set): the ``S3OutputPath`` of the job's
       ``DebugHookConfig`` (``/opt/ml/input/config/debughookconfig.json``, or the file named by
       ``SMDEBUG_CONFIG_FILE_PATH``), with the training job's name as the job folder.

    Raises ``OutDirMissing`` naming both when neither is there.
    """
    from trainguard.hook.sagemaker import load_hook_config, sagemaker_out_dir

    env = os.environ if environ is None else environ
    value = env.get(OUT_DIR_VAR, "").strip()
    if value:
        return value, None
    job = sagemaker_training_job_name(env)
    path = sagemaker_hook_config_path(env)
    if job:
        config = load_hook_config(path, missing_ok=True)
        out = sagemaker_out_dir(config, job) if config is not None else None
        if out is not None:
            return out, job
        detail = (
            f"this is SageMaker training job {job!r}, but {path} has no S3OutputPath "
            "(give the estimator a debugger_hook_config with s3_output_path)"
        )
    else:
        detail = "TRAINING_JOB_NAME is not set, so this is not a SageMaker training job"
    raise OutDirMissing(
        "trainguard.Hook() needs a job folder: pass out_dir (s3://bucket/jobs/<job> or a local "
        f"folder), or set {OUT_DIR_VAR}, or run as a SageMaker training job with a DebugHookConfig "
        f"(TRAINING_JOB_NAME and S3OutputPath in {SAGEMAKER_HOOK_CONFIG}); {detail}"
    )
