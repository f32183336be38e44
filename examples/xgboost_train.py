"""XGBoost with trainguard: the callback saves metrics, feature importance, trees, labels, predictions.

    pip install "trainguard[xgboost]"
    python examples/xgboost_train.py                           # runs/xgboost-demo
    TRAINGUARD_OUT_DIR=s3://my-bucket/jobs/xgb python examples/xgboost_train.py

Each boosting round is one step. The rules below are XGBoost's (TreeDepth,
FeatureImportanceOverweight) and the loss rules, which read the validation metric
(``validation-rmse``, in the ``losses`` collection, EVAL mode). Check the job offline with
``trainguard replay <out_dir>`` or ``trainguard.create_trial(<out_dir>)``.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import trainguard
import xgboost as xgb
from trainguard import SaveConfig
from trainguard.hook.xgboost_support import TrainguardCallback

DEFAULT_OUT_DIR = "runs/xgboost-demo"


def main(out_dir: str | None = None, rounds: int = 50) -> int:
    out_dir = out_dir or os.environ.get("TRAINGUARD_OUT_DIR") or DEFAULT_OUT_DIR
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 8))
    y = x[:, 0] + 0.5 * x[:, 1] ** 2 + 0.2 * x[:, 2:].sum(axis=1) + 0.1 * rng.normal(size=3000)
    dtrain = xgb.DMatrix(x[:2400], label=y[:2400])
    dval = xgb.DMatrix(x[2400:], label=y[2400:])
    rules = [
        {"RuleConfigurationName": name, "RuleParameters": {"rule_to_invoke": name}}
        for name in ("TreeDepth", "FeatureImportanceOverweight", "LossNotDecreasing", "Overfit")
    ]
    hook = trainguard.Hook(
        out_dir,
        # metrics and losses every round; the XGBoost collections every 5 rounds
        save_config=SaveConfig(save_interval=5),
        include_collections=["metrics", "losses", "feature_importance", "trees", "labels", "predictions"],
        collections=[
            trainguard.Collection("metrics", SaveConfig(save_interval=1)),
            trainguard.Collection("losses", SaveConfig(save_interval=1)),
        ],
        rules=rules,
    )
    evals = [(dtrain, "train"), (dval, "validation")]
    with hook:
        booster = xgb.train(
            {"max_depth": 4, "eta": 0.2, "eval_metric": ["rmse", "mae"]},
            dtrain,
            rounds,
            evals=evals,
            verbose_eval=False,
            # returns True (XGBoost stops) if a StopTraining rule fires in the service
            callbacks=[
                TrainguardCallback(hook, dtrain=dtrain, evals=evals, importance_types=("weight", "gain"))
            ],
        )
    rmse = booster.eval_set([(dval, "val")]).split(":")[-1]  # "[0]\tval-rmse:0.42"
    print(f"trained {booster.num_boosted_rounds()} rounds; validation rmse {rmse}; written to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
