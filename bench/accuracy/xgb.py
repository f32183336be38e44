"""The XGBoost family: boosted trees on the tabular teacher's data, through ``TrainguardCallback``.

A binary target from the same fixed teacher as the tabular family (class 0 against the
rest, 10% label noise), 400 training rows (small, so that deep unregularised trees
overfit) and 1000 validation rows. Faults are configuration faults, on from round 0:
``xgb_deep`` (trees far deeper than the data support, no regularisation) and ``xgb_leak``
(a training-only column that is a noisy copy of the label; in the validation data the
column holds the same values for unrelated rows, so the model that leans on it fails).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import trainguard
import xgboost as xgb
from trainguard.hook.config import Collection, SaveConfig
from trainguard.hook.config import CollectionKeys as K
from trainguard.hook.xgboost_support import FEATURE_IMPORTANCE, TREES, TrainguardCallback

from bench.accuracy import plan
from bench.accuracy.plan import RunSpec, XgbConfig
from bench.accuracy.record import full_statistics
from bench.accuracy.tasks import tabular_latent

N_TRAIN, N_VAL = 400, 1000
XGB_COLLECTIONS = (K.LOSSES, K.METRICS, FEATURE_IMPORTANCE, TREES, K.LABELS, K.PREDICTIONS)


def make_xgb_data(
    seed: int, leak_noise: float | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(40_000 + seed)
    z, logits = tabular_latent(N_TRAIN + N_VAL, rng)
    y = (logits.argmax(1) == 0).astype(np.float32)
    flip = rng.random(len(y)) < 0.10
    y[flip] = 1.0 - y[flip]
    x = z.astype(np.float32)
    x_tr, y_tr, x_va, y_va = x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]
    if leak_noise is not None:
        x_tr = x_tr.copy()
        x_va = x_va.copy()
        x_tr[:, -1] = y_tr + rng.normal(0, leak_noise, N_TRAIN)
        x_va[:, -1] = rng.permutation(y_va) + rng.normal(0, leak_noise, N_VAL)
    return x_tr, y_tr, x_va, y_va


def train_xgboost(spec: RunSpec, job_dir: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    cfg = XgbConfig(**spec.config)
    params: dict[str, Any] = {
        "objective": "binary:logistic",
        "eval_metric": "logloss",
        "max_depth": cfg.max_depth,
        "eta": cfg.eta,
        "subsample": cfg.subsample,
        "min_child_weight": cfg.min_child_weight,
        "lambda": cfg.reg_lambda,
        "seed": spec.seed,
        "nthread": 1,
        "verbosity": 0,
    }
    leak = None
    if spec.fault == "xgb_deep":
        params.update(
            {"max_depth": int(spec.params["max_depth"]), "min_child_weight": 0.0, "lambda": 0.0, "eta": 0.3}
        )
    elif spec.fault == "xgb_leak":
        leak = float(spec.params["noise"])
    x_tr, y_tr, x_va, y_va = make_xgb_data(spec.seed, leak)
    dtrain = xgb.DMatrix(x_tr, label=y_tr)
    dval = xgb.DMatrix(x_va, label=y_va)
    every = SaveConfig(save_interval=1)
    hook = trainguard.Hook(
        job_dir,
        include_collections=list(XGB_COLLECTIONS),
        collections=[Collection(name, every) for name in XGB_COLLECTIONS],
        stop_check_interval_s=0,
        **full_statistics(),
    )
    evals = [(dtrain, "train"), (dval, "validation")]
    log: dict[str, Any] = {}
    with hook:
        booster = xgb.train(
            params,
            dtrain,
            plan.XGB_ROUNDS,
            evals=evals,
            evals_result=log,
            verbose_eval=False,
            callbacks=[TrainguardCallback(hook, dtrain=dtrain, evals=evals)],
        )
    p = booster.predict(dval)
    acc = float(((p > 0.5) == (y_va > 0.5)).mean())
    val_loss = float(log["validation"]["logloss"][-1])
    outcome = {"val_loss": val_loss, "val_acc": acc, "diverged": False, "train_steps": plan.XGB_ROUNDS}
    trace = {
        "signals": {"loss": [float(v) for v in log["train"]["logloss"]]},
        "evals": [
            {"step": i, "val_loss": float(v), "val_acc": None}
            for i, v in enumerate(log["validation"]["logloss"])
        ],
    }
    return outcome, trace, {}
