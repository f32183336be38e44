"""XGBoost integration: ``TrainguardCallback(hook)``, a ``xgboost.callback.TrainingCallback``.

Importing this module imports xgboost; ``import trainguard`` and ``trainguard.hook`` never
do. Usage (the learning API; the scikit-learn API takes ``callbacks=[...]`` the same way)::

    from trainguard.hook.xgboost_support import TrainguardCallback

    with trainguard.Hook("runs/xgb-job", include_collections=["metrics", "losses",
                         "feature_importance", "trees"]) as hook:
        evals = [(dtrain, "train"), (dval, "validation")]
        xgb.train(params, dtrain, 100, evals=evals,
                  callbacks=[TrainguardCallback(hook, dtrain=dtrain, evals=evals)])

One boosting round is one step (``step=`` the round number XGBoost passes, ``epoch``).
What is saved after each round, each only when its collection is due under the hook's
save configs (the hook's collections decide *when*; the callback's arguments *what*: a
collection the callback writes and the hook lacks is added with its built-in defaults,
every 50 rounds for ``feature_importance``/``trees``/``labels``/``predictions``, every
round for ``metrics``/``losses``):

* **Metrics** (``metrics``): the newest value of every metric in ``evals_log`` as a scalar
  ``<set>-<metric>`` (XGBoost's and smdebug's name, e.g. ``train-rmse``,
  ``validation-logloss``). The training set's metrics (the set named ``train_set``, default
  ``"train"``, or the one whose DMatrix is ``dtrain`` in ``evals``) are saved in TRAIN mode,
  every other set's in EVAL mode. Per set, one loss-like metric (``loss_metric`` if given,
  else the first metric that is not maximised, e.g. rmse/logloss/mlogloss but not auc/ndcg/
  map/pre) is also in ``losses``, so LossNotDecreasing, Overfit and Overtraining read it.
* **Feature importance** (``feature_importance``, TRAIN mode): for each of
  ``importance_types`` (default ``("weight",)``; also ``gain``, ``cover``, ``total_gain``,
  ``total_cover``), one scalar per feature ``feature_importance/<type>/<feature>`` (``f<i>``
  unless the DMatrix named its features), each feature's share of the type's total
  (normalised, as smdebug saves them). Features the model never split on are saved as 0,
  so FeatureImportanceOverweight sees the model's real feature count (a model that uses 1
  of 20 features is overweight; with only the used features it would never be judged). At
  most ``max_features`` per type (the largest; a warning is logged once beyond that).
* **Trees** (``trees``, TRAIN mode): ``trees/Node``, the node ids (XGBoost's numbering) of
  every tree added since the previous saved step (with ``save_interval=1``: that round's
  trees), which TreeDepth reads (``log2`` of the largest id); and ``trees/Depth``, the
  exact depth of each of those nodes (from the tree dump), whose ``max`` is the true depth.
  Trees are dumped once each, so the cost does not grow with the model.
* **Labels and predictions** (``labels``, ``predictions``), when the callback is given the
  data (``dtrain=`` in TRAIN mode, ``evals=`` in EVAL mode): ``<set>/labels`` and
  ``<set>/predictions`` of up to ``max_samples`` evenly spaced rows (a fixed subset, taken
  once), small enough for the hook to send every element (``TensorStats.values``), which
  ClassImbalance and Confusion read. For classification objectives (``binary:logistic``,
  ``binary:logitraw``, ``binary:hinge``, ``multi:softprob``, ``multi:softmax``) the
  predictions are the predicted class ids, like the labels; ``class_predictions=False``
  saves ``Booster.predict``'s raw output instead.

Feature importance and trees are saved for tree boosters (``gbtree``, ``dart``) only.
Under ``xgboost.cv`` only the metrics (the folds' mean) are saved.

Stopping: when the service asks the job to stop (a rule with the StopTraining action),
``after_iteration`` returns True, XGBoost's own way to end training: ``xgb.train`` returns
the booster trained so far and nothing is raised into the training code.

Never breaking training: an error in one part (say the tree dump of an unusual booster)
is logged once with its traceback and that part is switched off; the rest continues.
Close the hook after training (``with`` or ``hook.close()``): the last round is written then.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xgboost

from trainguard.format.documents import MAX_VALUES
from trainguard.hook.config import CollectionKeys
from trainguard.hook.core import Hook, StopTrainingRequested
from trainguard.modes import ModeKeys

log = logging.getLogger("trainguard.hook")

#: XGBoost-specific collections (smdebug's names)
FEATURE_IMPORTANCE = "feature_importance"
TREES = "trees"
IMPORTANCE_TYPES = ("weight", "gain", "cover", "total_gain", "total_cover")
#: metrics XGBoost maximises (as its EarlyStopping callback lists them): never a loss
MAXIMIZED_METRICS = ("auc", "aucpr", "pre", "map", "ndcg", "interval-regression-accuracy")
TREE_BOOSTERS = ("gbtree", "dart")
#: objectives whose predictions are turned into class ids, and how
_CLASS_OBJECTIVES = {
    "binary:logistic": "threshold",
    "binary:logitraw": "margin",
    "binary:hinge": "ids",
    "multi:softmax": "ids",
    "multi:softprob": "argmax",
}

_K = CollectionKeys


def is_maximized(metric: str) -> bool:
    """Whether XGBoost maximises ``metric`` (``auc``, ``ndcg@5``...), as its EarlyStopping decides."""
    return metric != "mape" and metric.startswith(MAXIMIZED_METRICS)


class _DataSet:
    """A DMatrix whose labels and predictions are saved: a fixed, evenly spaced subset of rows."""

    def __init__(self, name: str, mode: ModeKeys, dmatrix: Any) -> None:
        self.name = name
        self.mode = mode
        self.dmatrix = dmatrix
        self.rows: np.ndarray[Any, Any] | None = None
        self.labels: np.ndarray[Any, Any] | None = None
        self._all = True
        self._subset: Any = None

    def prepare(self, max_rows: int) -> None:
        """Choose the rows (at most ``max_rows``, evenly spaced) and read their labels."""
        n = int(self.dmatrix.num_row())
        self.rows = np.unique(np.linspace(0, max(n - 1, 0), num=min(n, max_rows)).astype(np.int64))
        self._all = n <= max_rows
        self._subset = None
        labels = np.asarray(self.dmatrix.get_label(), dtype=np.float32)
        if not n or not labels.size or labels.size % n:
            self.labels = None
        else:  # one label per row, or (rows, targets) for multi-target models
            self.labels = (labels if labels.size == n else labels.reshape(n, -1))[self.rows]

    def predict(self, model: Any) -> np.ndarray[Any, Any]:
        assert self.rows is not None
        if self._all:
            out: np.ndarray[Any, Any] = np.asarray(model.predict(self.dmatrix))
            return out
        if self._subset is None:
            try:
                self._subset = self.dmatrix.slice(self.rows, allow_groups=True)
            except Exception:  # QuantileDMatrix, external memory: predict on all, keep the rows
                self._subset = False
        if self._subset is False:
            out = np.asarray(model.predict(self.dmatrix))[self.rows]
        else:
            out = np.asarray(model.predict(self._subset))
        return out


class TrainguardCallback(xgboost.callback.TrainingCallback):  # type: ignore[misc]
    """Saves XGBoost metrics, feature importance, trees, labels and predictions each round.

    Parameters
    ----------
    hook
        The ``trainguard.Hook`` to save through (the caller creates and closes it).
    dtrain
        The training DMatrix: its labels and predictions are saved in TRAIN mode when the
        ``labels``/``predictions`` collections are due. None: not saved.
    evals
        ``[(DMatrix, name), ...]`` as given to ``xgb.train``: labels and predictions of each
        set (the one that is ``dtrain`` in TRAIN mode, the others in EVAL mode).
    train_set
        The ``evals`` name of the training set in ``evals_log`` (its metrics go to TRAIN
        mode). A set in ``evals`` whose DMatrix is ``dtrain`` counts as training set too.
        With the scikit-learn API the sets are named ``validation_0``, ``validation_1``...
    loss_metric
        The metric saved in ``losses`` for every set; None: the first non-maximised one.
    importance_types
        Feature importance types to save (``()``: none).
    save_trees
        Save ``trees/Node`` and ``trees/Depth`` (TreeDepth).
    max_samples
        Rows whose labels and predictions are saved (capped so that a tensor fits in
        ``MAX_VALUES`` elements, the most the hook sends element by element).
    max_features
        Most features saved per importance type.
    class_predictions
        Save class ids (not probabilities) as predictions for classification objectives.
    """

    def __init__(
        self,
        hook: Hook,
        *,
        dtrain: Any = None,
        evals: Sequence[tuple[Any, str]] | None = None,
        train_set: str = "train",
        loss_metric: str | None = None,
        importance_types: Sequence[str] = ("weight",),
        save_trees: bool = True,
        max_samples: int = 512,
        max_features: int = 1000,
        class_predictions: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(hook, Hook):
            raise TypeError(f"TrainguardCallback needs a trainguard.Hook, got {type(hook).__name__}")
        unknown = [t for t in importance_types if t not in IMPORTANCE_TYPES]
        if unknown:
            raise ValueError(f"unknown importance types {unknown}; choose from {list(IMPORTANCE_TYPES)}")
        if max_samples < 1 or max_features < 1:
            raise ValueError("max_samples and max_features must be positive")
        self.hook = hook
        self.loss_metric = loss_metric
        self.importance_types = tuple(dict.fromkeys(importance_types))
        self.save_trees = save_trees
        self.max_samples = max_samples
        self.max_features = max_features
        self.class_predictions = class_predictions
        self.train_names = {train_set}
        self.data: list[_DataSet] = []
        seen: set[int] = set()
        for dmatrix, name in evals or ():
            if dmatrix is dtrain and dtrain is not None:
                self.train_names.add(name)
                self.data.append(_DataSet(name, ModeKeys.TRAIN, dmatrix))
            else:
                self.data.append(_DataSet(name, ModeKeys.EVAL, dmatrix))
            seen.add(id(dmatrix))
        if dtrain is not None and id(dtrain) not in seen:
            self.data.insert(0, _DataSet(train_set, ModeKeys.TRAIN, dtrain))
        # the collections this callback writes: added (built-in defaults) if the hook lacks them
        wanted = [_K.METRICS, _K.LOSSES]
        if self.importance_types:
            wanted.append(FEATURE_IMPORTANCE)
        if save_trees:
            wanted.append(TREES)
        if self.data:
            wanted += [_K.LABELS, _K.PREDICTIONS]
        for name in wanted:
            hook.get_collection(name)
        hook.add_framework("xgboost", str(getattr(xgboost, "__version__", "")) or None, produces=wanted)
        self._objective: str | None = None
        self._tree_booster = True
        self._trees_done = 0  # boosting rounds whose trees were already saved
        self._prepared = False
        self._off: set[str] = set()
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ XGBoost callbacks
    def before_training(self, model: Any) -> Any:
        try:
            config = json.loads(model.save_config())["learner"]
            self._objective = str(config["objective"]["name"])
            self._tree_booster = str(config["gradient_booster"]["name"]) in TREE_BOOSTERS
            self._trees_done = int(model.num_boosted_rounds())
            params = config.get("learner_model_param", {})
            outputs = max(int(params.get("num_class", 0) or 0), int(params.get("num_target", 1) or 1))
        except Exception:  # xgboost.cv's packed booster, or an unexpected config: metrics only
            self._objective = None
            self._tree_booster = False
            outputs = 1
        try:
            self._prepare_data(outputs)
        except Exception:
            self.data = []
            self._warn_once(
                "data", "cannot read the data sets' labels; not saving labels/predictions", exc_info=True
            )
        return model

    def after_iteration(self, model: Any, epoch: int, evals_log: dict[str, Any]) -> bool:
        hook = self.hook
        if hook.disabled:
            return False
        if hook.should_stop:
            log.warning("trainguard: stop requested; ending XGBoost training after round %d", epoch)
            return True
        try:
            self._save_round(model, int(epoch), evals_log)
        except StopTrainingRequested:
            log.warning("trainguard: stop requested; ending XGBoost training after round %d", epoch)
            return True
        except Exception:
            self._warn_once(
                "round", "cannot save XGBoost round %d (training continues)", epoch, exc_info=True
            )
        return False

    # ------------------------------------------------------------------ saving
    def _prepare_data(self, outputs: int) -> None:
        """Fix each data set's rows: every saved labels/predictions tensor fits in MAX_VALUES."""
        classes = self.class_predictions and self._objective in _CLASS_OBJECTIVES
        width = 1 if classes else max(outputs, 1)
        for data in self.data:
            label_width = max(1, int(data.dmatrix.get_label().size) // max(int(data.dmatrix.num_row()), 1))
            data.prepare(max(1, min(self.max_samples, MAX_VALUES // max(width, label_width))))
        self._prepared = True

    def _save_round(self, model: Any, step: int, evals_log: dict[str, Any]) -> None:
        self._part("metrics", self._save_metrics, step, evals_log)
        if self._tree_booster:
            due = self._due(step, ModeKeys.TRAIN)
            if self.importance_types and FEATURE_IMPORTANCE in due:
                self._part("feature importance", self._save_importance, model, step)
            if self.save_trees and TREES in due:
                self._part("trees", self._save_trees, model, step)
        if self.data and not self._prepared:
            self._part("labels and predictions", self._prepare_data, 1)
            if not self._prepared:
                self.data = []
        for data in self.data:
            due = self._due(step, data.mode)
            if _K.LABELS in due and data.labels is not None:
                self._part(f"labels of {data.name}", self._save_labels, data, step)
            if _K.PREDICTIONS in due:
                self._part(f"predictions of {data.name}", self._save_predictions, model, data, step)

    def _save_metrics(self, step: int, evals_log: dict[str, Any]) -> None:
        for set_name, metrics in evals_log.items():
            mode = ModeKeys.TRAIN if set_name in self.train_names else ModeKeys.EVAL
            if self.hook.plan(step, mode) is None:
                continue
            loss = self._pick_loss(list(metrics))
            for metric, history in metrics.items():
                if not history:
                    continue
                value = history[-1]
                if isinstance(value, tuple | list):  # xgboost.cv: (mean, std)
                    value = value[0]
                targets = [_K.METRICS, _K.LOSSES] if metric == loss else [_K.METRICS]
                self.hook.record_scalar(f"{set_name}-{metric}", float(value), targets)

    def _pick_loss(self, metrics: list[str]) -> str | None:
        if self.loss_metric is not None:
            return self.loss_metric if self.loss_metric in metrics else None
        return next((m for m in metrics if not is_maximized(m)), None)

    def _save_importance(self, model: Any, step: int) -> None:
        names = list(model.feature_names or [f"f{i}" for i in range(int(model.num_features()))])
        for kind in self.importance_types:
            scores = {str(k): float(np.sum(v)) for k, v in model.get_score(importance_type=kind).items()}
            values = dict.fromkeys(names, 0.0)
            values.update(scores)
            total = sum(v for v in values.values() if v > 0)
            if total <= 0:
                continue
            if len(values) > self.max_features:
                self._warn_once(
                    "features",
                    "%d features: saving the importance of the largest %d only (max_features)",
                    len(values),
                    self.max_features,
                )
                keep = sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))[: self.max_features]
                values = dict(keep)
            if self.hook.plan(step, ModeKeys.TRAIN) is None:
                return
            for feature, value in values.items():
                self.hook.record_scalar(
                    f"{FEATURE_IMPORTANCE}/{kind}/{feature}", value / total, [FEATURE_IMPORTANCE]
                )

    def _save_trees(self, model: Any, step: int) -> None:
        rounds = int(model.num_boosted_rounds())
        start = min(self._trees_done, rounds)
        if start >= rounds:
            return
        dump = model.get_dump() if start == 0 else model[start:rounds].get_dump()
        self._trees_done = rounds
        ids, depths = tree_nodes(dump)
        if ids.size:
            self._save("trees/Node", ids, TREES, step, ModeKeys.TRAIN)
            self._save("trees/Depth", depths, TREES, step, ModeKeys.TRAIN)

    def _save_labels(self, data: _DataSet, step: int) -> None:
        self._save(f"{data.name}/labels", data.labels, _K.LABELS, step, data.mode)

    def _save_predictions(self, model: Any, data: _DataSet, step: int) -> None:
        preds = data.predict(model)
        if self.class_predictions and self._objective in _CLASS_OBJECTIVES:
            preds = class_ids(preds, _CLASS_OBJECTIVES[self._objective])
        self._save(f"{data.name}/predictions", preds, _K.PREDICTIONS, step, data.mode)

    def _save(self, name: str, value: Any, collection: str, step: int, mode: ModeKeys) -> None:
        if self.hook.plan(step, mode) is not None:
            self.hook.record_tensor(name, value, [collection])

    # ------------------------------------------------------------------ helpers
    def _due(self, step: int, mode: ModeKeys) -> frozenset[str]:
        """The collections due at (step, mode), per the hook's save configs and mode steps."""
        plan = self.hook.plan(step, mode)
        return plan.due if plan is not None else frozenset()

    def _part(self, what: str, fn: Callable[..., None], *args: Any) -> None:
        if what in self._off:
            return
        try:
            fn(*args)
        except StopTrainingRequested:
            raise
        except Exception:
            self._off.add(what)
            log.warning(
                "trainguard: cannot save the XGBoost %s; not saving it again (training continues)",
                what,
                exc_info=True,
            )

    def _warn_once(self, key: str, message: str, *args: Any, exc_info: bool = False) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("trainguard: " + message, *args, exc_info=exc_info)


def tree_nodes(dump: Sequence[str]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Node ids and node depths of every tree in a text dump (``Booster.get_dump()``).

    A line is ``<tabs><node id>:...``; the number of leading tabs is the node's depth.
    """
    ids: list[int] = []
    depths: list[int] = []
    for tree in dump:
        for line in tree.splitlines():
            body = line.lstrip("\t")
            head, sep, _ = body.partition(":")
            if not sep or not head.strip().isdigit():
                continue
            ids.append(int(head))
            depths.append(len(line) - len(body))
    return np.asarray(ids, dtype=np.int64), np.asarray(depths, dtype=np.int64)


def class_ids(preds: np.ndarray[Any, Any], how: str) -> np.ndarray[Any, Any]:
    """Predicted class ids from ``Booster.predict``'s output for a classification objective."""
    if how == "argmax" and preds.ndim >= 2:
        out: np.ndarray[Any, Any] = np.argmax(preds, axis=-1)
    elif how == "threshold":
        out = preds > 0.5
    elif how == "margin":
        out = preds > 0.0
    else:
        out = np.rint(preds)
    return out.astype(np.int32)


__all__ = ["TrainguardCallback", "class_ids", "is_maximized", "tree_nodes"]
