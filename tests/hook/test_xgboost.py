"""The XGBoost callback: what it writes, and the XGBoost rules' verdicts on it (replay)."""

from __future__ import annotations

import logging
import runpy
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

xgb = pytest.importorskip("xgboost")

import trainguard  # noqa: E402
from segment_reader import JobView  # noqa: E402
from trainguard.engine.replay import replay  # noqa: E402
from trainguard.engine.sources import LocalJob  # noqa: E402
from trainguard.format import layout  # noqa: E402
from trainguard.format.documents import StopSignal, dump_document  # noqa: E402
from trainguard.hook.xgboost_support import TrainguardCallback, is_maximized, tree_nodes  # noqa: E402

ALL = ["metrics", "losses", "feature_importance", "trees", "labels", "predictions"]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def rule(name: str, **params: object) -> dict:
    return {
        "RuleConfigurationName": name,
        "RuleParameters": {"rule_to_invoke": name, **{k: str(v) for k, v in params.items()}},
    }


def judge(path, rules) -> dict[str, str]:
    result = replay(LocalJob.open(path), rules=rules)
    return {r["RuleConfigurationName"]: r["RuleEvaluationStatus"] for r in result.summary()}


def regression(n: int, features: int, seed: int, dominant: bool = False, noise_only: bool = False):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features))
    if noise_only:
        y = rng.normal(size=n)
    elif dominant:
        y = 5 * x[:, 0] + 0.05 * x[:, 1:].sum(axis=1)
    else:
        y = x.sum(axis=1) + 0.1 * rng.normal(size=n)
    return x, y


def train(path, params, x, y, xv=None, yv=None, rounds=20, collections=ALL, interval=1, **kwargs):
    """Train with the callback into ``path``; returns the booster."""
    hook = trainguard.Hook(
        path,
        save_config=trainguard.SaveConfig(save_interval=interval) if interval else None,
        include_collections=collections,
        stop_check_interval_s=0,
    )
    params = {"nthread": 1, **params}
    dtrain = xgb.DMatrix(x, label=y)
    evals = [(dtrain, "train")]
    if xv is not None:
        evals.append((xgb.DMatrix(xv, label=yv), "validation"))
    with hook:
        callback = TrainguardCallback(hook, dtrain=dtrain, evals=evals, **kwargs)
        return xgb.train(params, dtrain, rounds, evals=evals, verbose_eval=False, callbacks=[callback])


@pytest.fixture(scope="module")
def balanced_job(tmp_path_factory):
    path = tmp_path_factory.mktemp("xgb") / "balanced"
    x, y = regression(1000, 10, seed=0)
    xv, yv = regression(300, 10, seed=1)
    train(path, {"max_depth": 4}, x, y, xv, yv, importance_types=("weight", "gain"))
    return path


def test_writes_a_readable_job(balanced_job):
    trial = JobView(balanced_job)
    assert trial.steps() == list(range(20))
    names = set(trial.tensor_names())
    assert {"train-rmse", "validation-rmse", "trees/Node", "trees/Depth"} <= names
    assert {f"feature_importance/weight/f{i}" for i in range(10)} <= names
    assert {f"feature_importance/gain/f{i}" for i in range(10)} <= names
    assert {"train/labels", "train/predictions", "validation/labels", "validation/predictions"} <= names
    # metrics: training set in TRAIN, validation in EVAL, the loss-like one also in losses
    train_rmse = trial.scalars(mode="TRAIN")["train-rmse"]
    val_rmse = trial.scalars(mode="EVAL")["validation-rmse"]
    assert sorted(train_rmse) == sorted(val_rmse) == list(range(20))
    assert train_rmse[19] < train_rmse[0]
    assert trial.header(0).modes["EVAL"].scalars["validation-rmse"].collections == ["metrics", "losses"]
    # importances are shares of the total
    weights = [trial.scalars(mode="TRAIN")[f"feature_importance/weight/f{i}"][19] for i in range(10)]
    assert sum(weights) == pytest.approx(1.0)
    # trees: a depth-4 tree per round, node ids as XGBoost numbers them
    depth = trial.tensor("trees/Depth").stats(5, mode="TRAIN")
    assert depth.max == 4
    assert trial.tensor("trees/Node").stats(5, mode="TRAIN").max >= 15
    # labels and predictions: a small fixed subset, every element sent
    labels = trial.tensor("validation/labels").stats(3, mode="EVAL")
    preds = trial.tensor("validation/predictions").stats(3, mode="EVAL")
    assert labels.values is not None and preds.values is not None
    assert len(labels.values) == len(preds.values) == 300
    assert [f.name for f in trial.manifest.frameworks][-1] == "xgboost"


@pytest.mark.parametrize(
    ("max_depth", "depth", "status"),
    [(4, 2, "IssuesFound"), (3, None, "NoIssuesFound"), (6, None, "IssuesFound")],
)
def test_tree_depth(tmp_path, max_depth, depth, status):
    x, y = regression(1000, 10, seed=2)
    train(tmp_path / "job", {"max_depth": max_depth}, x, y, collections=["metrics", "trees"], rounds=10)
    params = {} if depth is None else {"depth": depth}
    assert judge(tmp_path / "job", [rule("TreeDepth", **params)]) == {"TreeDepth": status}


@pytest.mark.parametrize(("dominant", "status"), [(True, "IssuesFound"), (False, "NoIssuesFound")])
def test_feature_importance_overweight(tmp_path, dominant, status):
    x, y = regression(1000, 10, seed=3, dominant=dominant)
    train(tmp_path / "job", {"max_depth": 4}, x, y, collections=["metrics", "feature_importance"])
    verdict = judge(tmp_path / "job", [rule("FeatureImportanceOverweight")])
    assert verdict == {"FeatureImportanceOverweight": status}


def test_unused_features_count_as_zero_importance(tmp_path):
    # one leaked feature: the trees split on it alone; with only the used features saved the
    # rule would never judge a step (1 feature <= nfeatures), with the zeros it fires
    rng = np.random.default_rng(4)
    x = rng.normal(size=(500, 8))
    y = np.sign(x[:, 0])
    train(tmp_path / "job", {"max_depth": 2}, x, y, collections=["feature_importance"], rounds=5)
    trial = JobView(tmp_path / "job")
    assert trial.scalars(mode="TRAIN")["feature_importance/weight/f7"][0] == 0.0
    assert judge(tmp_path / "job", [rule("FeatureImportanceOverweight")]) == {
        "FeatureImportanceOverweight": "IssuesFound"
    }


def test_loss_rules_on_the_eval_metric(tmp_path):
    # a learnable problem with plenty of data: validation loss falls, close to the training loss
    rng = np.random.default_rng(5)
    x = rng.normal(size=(4000, 5))
    y = x[:, 0] + x[:, 1] + 0.5 * rng.normal(size=4000)
    xv = rng.normal(size=(1000, 5))
    yv = xv[:, 0] + xv[:, 1] + 0.5 * rng.normal(size=1000)
    train(tmp_path / "good", {"max_depth": 2, "eta": 0.3}, x, y, xv, yv, collections=["metrics", "losses"])
    # 20 rounds: LossNotDecreasing's default blocks of 50 training steps would compare nothing
    rules = [rule("LossNotDecreasing", num_steps="5"), rule("Overfit")]
    assert judge(tmp_path / "good", rules) == {
        "LossNotDecreasing": "NoIssuesFound",
        "Overfit": "NoIssuesFound",
    }
    # labels that are pure noise and deep trees: the model memorises, validation loss rises
    x, y = regression(300, 5, seed=6, noise_only=True)
    xv, yv = regression(300, 5, seed=7, noise_only=True)
    train(tmp_path / "noise", {"max_depth": 6, "eta": 0.5}, x, y, xv, yv, collections=["metrics", "losses"])
    # a validation loss that rises while training falls is Overfit's finding; it is not a stall
    # (LossNotDecreasing's noise-aware test), though SageMaker's block comparison fires on it
    assert judge(tmp_path / "noise", rules) == {
        "LossNotDecreasing": "NoIssuesFound",
        "Overfit": "IssuesFound",
    }
    sagemaker = [rule("LossNotDecreasing", num_steps="5", diff_percent="0")]
    assert judge(tmp_path / "noise", sagemaker) == {"LossNotDecreasing": "IssuesFound"}


def test_classification_labels_and_class_predictions(tmp_path):
    rng = np.random.default_rng(8)
    x = rng.normal(size=(2000, 4))
    y = np.digitize(x[:, 0], [-0.5, 0.5])  # 3 balanced-ish classes, easy to learn
    xv = rng.normal(size=(600, 4))
    yv = np.digitize(xv[:, 0], [-0.5, 0.5])
    params = {"objective": "multi:softprob", "num_class": 3, "max_depth": 3}
    train(tmp_path / "mc", params, x, y, xv, yv, collections=["metrics", "losses", "labels", "predictions"])
    trial = JobView(tmp_path / "mc")
    assert "validation-mlogloss" in trial.scalars(mode="EVAL")
    preds = trial.tensor("validation/predictions").stats(19, mode="EVAL")
    labels = trial.tensor("validation/labels").stats(19, mode="EVAL")
    assert len(preds.values) == len(labels.values) == 512  # max_samples of 600 rows
    assert set(preds.values) <= {0.0, 1.0, 2.0}  # class ids, not probabilities
    accuracy = np.mean(np.array(preds.values) == np.array(labels.values))
    assert accuracy > 0.9
    verdict = judge(
        tmp_path / "mc", [rule("ClassImbalance"), rule("Confusion"), rule("LossNotDecreasing", num_steps="5")]
    )
    assert verdict == {
        "ClassImbalance": "NoIssuesFound",
        "Confusion": "NoIssuesFound",
        "LossNotDecreasing": "NoIssuesFound",
    }
    # an imbalanced binary problem
    yb = (x[:, 0] > 1.8).astype(int)
    train(
        tmp_path / "imb",
        {"objective": "binary:logistic"},
        x,
        yb,
        collections=["labels", "predictions"],
        rounds=3,
    )
    assert judge(tmp_path / "imb", [rule("ClassImbalance")]) == {"ClassImbalance": "IssuesFound"}


def test_respects_the_save_config(tmp_path):
    x, y = regression(500, 6, seed=9)
    hook = trainguard.Hook(
        tmp_path / "job",
        include_collections=["metrics", "losses", "feature_importance", "trees"],
        collections=[
            trainguard.Collection("feature_importance", trainguard.SaveConfig(save_interval=5)),
            trainguard.Collection("trees", trainguard.SaveConfig(save_steps=[3])),
        ],
        stop_check_interval_s=0,
    )
    dtrain = xgb.DMatrix(x, label=y)
    with hook:
        xgb.train(
            {"max_depth": 3, "nthread": 1},
            dtrain,
            12,
            evals=[(dtrain, "train")],
            verbose_eval=False,
            callbacks=[TrainguardCallback(hook)],
        )
    trial = JobView(tmp_path / "job")
    scalars = trial.scalars(mode="TRAIN")
    assert sorted(scalars["train-rmse"]) == list(range(12))
    assert sorted(scalars["feature_importance/weight/f0"]) == [0, 5, 10]
    assert trial.tensor("trees/Node").steps(mode="TRAIN") == [3]
    # trees since the previous save: rounds 0..3, four trees
    assert (
        trial.tensor("trees/Node").stats(3, mode="TRAIN").numel
        == trial.tensor("trees/Depth").stats(3, mode="TRAIN").numel
    )
    assert "train/labels" not in trial.tensor_names()  # no data given to the callback


def test_default_hook_gets_the_xgboost_collections(tmp_path):
    x, y = regression(300, 5, seed=10)
    with trainguard.Hook(tmp_path / "job", stop_check_interval_s=0) as hook:
        dtrain = xgb.DMatrix(x, label=y)
        xgb.train(
            {"max_depth": 2, "nthread": 1},
            dtrain,
            3,
            evals=[(dtrain, "train")],
            verbose_eval=False,
            callbacks=[TrainguardCallback(hook)],
        )
    trial = JobView(tmp_path / "job")
    names = trial.tensor_names()
    assert "train-rmse" in names and "trees/Node" in names and "feature_importance/weight/f0" in names
    assert trial.tensor("trees/Node").steps(mode="TRAIN") == [0]  # built-in: every 50 rounds


def test_cv_and_gblinear(tmp_path):
    x, y = regression(300, 5, seed=11)
    with trainguard.Hook(tmp_path / "cv", include_collections=ALL, stop_check_interval_s=0) as hook:
        xgb.cv(
            {"max_depth": 2, "nthread": 1},
            xgb.DMatrix(x, label=y),
            4,
            nfold=2,
            callbacks=[TrainguardCallback(hook)],
        )
    scalars = JobView(tmp_path / "cv").scalars(mode="TRAIN")
    assert sorted(scalars["train-rmse"]) == [0, 1, 2, 3]
    with trainguard.Hook(tmp_path / "lin", include_collections=ALL, stop_check_interval_s=0) as hook:
        dtrain = xgb.DMatrix(x, label=y)
        xgb.train(
            {"booster": "gblinear", "nthread": 1},
            dtrain,
            3,
            evals=[(dtrain, "train")],
            verbose_eval=False,
            callbacks=[TrainguardCallback(hook, dtrain=dtrain)],
        )
        assert not hook.disabled
    names = JobView(tmp_path / "lin").tensor_names()
    assert "train-rmse" in names and "train/predictions" in names and "trees/Node" not in names


def test_sklearn_api(tmp_path):
    pytest.importorskip("sklearn")
    x, y = regression(300, 5, seed=11)
    with trainguard.Hook(tmp_path / "sk", include_collections=ALL, stop_check_interval_s=0) as hook:
        callback = TrainguardCallback(hook, train_set="validation_0")
        model = xgb.XGBRegressor(n_estimators=5, max_depth=2, n_jobs=1, callbacks=[callback])
        model.fit(x, y, eval_set=[(x, y)], verbose=False)
    assert "validation_0-rmse" in JobView(tmp_path / "sk").scalars(mode="TRAIN")


def test_stop_request_ends_training_the_xgboost_way(tmp_path):
    x, y = regression(300, 5, seed=12)
    hook = trainguard.Hook(tmp_path / "job", include_collections=["metrics"], stop_check_interval_s=0)
    signal = StopSignal(job="job", rule="LossNotDecreasing", reason="test", requested_at=time.time())
    hook.store.put(layout.STOP_SIGNAL, dump_document(signal))
    dtrain = xgb.DMatrix(x, label=y)

    class StopAfter(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log):
            if epoch == 2:
                hook.request_stop_check()
            return False

    with hook:
        booster = xgb.train(
            {"max_depth": 2, "nthread": 1},
            dtrain,
            20,
            evals=[(dtrain, "train")],
            verbose_eval=False,
            callbacks=[StopAfter(), TrainguardCallback(hook)],
        )
    # the signal arrived during round 2: XGBoost stops after it, returning the booster
    assert booster.num_boosted_rounds() == 3
    assert JobView(tmp_path / "job").steps() == [0, 1]
    assert JobView(tmp_path / "job").end_markers()[0].stopped


def test_a_failing_part_is_switched_off_not_the_training(tmp_path, caplog, monkeypatch):
    x, y = regression(300, 5, seed=13)
    monkeypatch.setattr(xgb.Booster, "get_dump", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with caplog.at_level(logging.WARNING, logger="trainguard.hook"):
        train(
            tmp_path / "job",
            {"max_depth": 2, "nthread": 1},
            x,
            y,
            collections=["metrics", "trees", "feature_importance"],
            rounds=4,
        )
    assert sum("cannot save the XGBoost trees" in r.getMessage() for r in caplog.records) == 1
    trial = JobView(tmp_path / "job")
    assert "trees/Node" not in trial.tensor_names()
    assert sorted(trial.scalars(mode="TRAIN")["feature_importance/weight/f0"]) == [0, 1, 2, 3]


def test_arguments_are_checked(tmp_path):
    with trainguard.Hook(tmp_path / "job", stop_check_interval_s=0) as hook:
        with pytest.raises(ValueError, match="importance"):
            TrainguardCallback(hook, importance_types=("weights",))
        with pytest.raises(TypeError):
            TrainguardCallback(object())  # type: ignore[arg-type]


def test_helpers():
    assert is_maximized("auc") and is_maximized("ndcg@5") and is_maximized("map@10-")
    assert not is_maximized("rmse") and not is_maximized("mlogloss") and not is_maximized("error@0.7")
    ids, depths = tree_nodes(
        ["0:[f0<1] yes=1,no=2\n\t1:leaf=0.1\n\t2:[f1<0] yes=3,no=4\n\t\t3:leaf=1\n\t\t4:leaf=2\n"]
    )
    assert ids.tolist() == [0, 1, 2, 3, 4] and depths.tolist() == [0, 1, 1, 2, 2]


def test_importing_trainguard_does_not_import_xgboost():
    code = "import sys, trainguard, trainguard.hook; trainguard.Hook; assert 'xgboost' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_example_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINGUARD_OUT_DIR", str(tmp_path / "example"))
    module = runpy.run_path(str(EXAMPLES / "xgboost_train.py"))
    assert module["main"](rounds=15) == 0
    trial = JobView(tmp_path / "example")
    assert len(trial.scalars(mode="EVAL")["validation-rmse"]) == 15
