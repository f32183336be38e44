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
