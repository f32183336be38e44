"""What the corpus holds: the clean sweep, the fault catalogue, the splits, every run's spec.

Splits. ``dev`` (seeds 0-1) is the only split defaults may be chosen on; ``test`` uses
other seeds (100-101) and adds the ``resnet`` family (BatchNorm and residual blocks), which
no choice ever sees. XGBoost has one family: its dev and test differ by seed.

The sweep. Per family, every optimizer (SGD, SGD with momentum, Adam, AdamW, RMSprop) at
three learning rates from a sweep, with a schedule (constant, cosine, step decay) and a
weight decay assigned in rotation, so every schedule and decay meets every optimizer
across the families. A sweep run counts as *clean* only if its outcome is within the
margin of its family's best configuration (``labels.CLEAN_MARGIN``); the others are
reported as suboptimal and are neither positives nor negatives.

Faults. Each fault kind is a cause (what went wrong in the job), graded in three severities
(the mildest is meant to be a near-miss: too mild to harm), switched on at a random onset
between 10% and 70% of the run (initialisation faults at step 0, by nature), on a randomly
drawn clean run of the same split, which is its twin: identical up to the onset.
``detects`` are the rules whose documented purpose is that cause; ``tolerated`` rules may
fire on it too (a consequence, e.g. a loss that stops decreasing after the LR went to 0)
without counting as a false alarm. Labels come from the cause and the outcome
(``labels.py``), never from a rule's condition.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import asdict, dataclass, field
from typing import Any

#: training steps of every PyTorch run; losses every step, tensor statistics recorded every
#: ``TRAIN_RECORD_INTERVAL`` steps (EVAL: every step), which emulates any save interval that
#: is a multiple of it (trainguard's 50, SageMaker's 500)
STEPS = 600
TRAIN_RECORD_INTERVAL = 10
EVAL_EVERY = 50
EVAL_BATCHES = 4
#: XGBoost boosting rounds
XGB_ROUNDS = 120

#: tensor collections the recording saves (with their built-in reductions, plus update norms)
RECORDED_COLLECTIONS = (
    "weights",
    "biases",
    "gradients",
    "relu_output",
    "relu_input",
    "tanh_input",
    "sigmoid_input",
    "inputs",
    "labels",
    "predictions",
)

TORCH_FAMILIES = ("tabular", "cnn", "lstm", "transformer", "resnet")
DEV_FAMILIES = ("tabular", "cnn", "lstm", "transformer", "xgboost")
HELD_OUT_FAMILIES = ("resnet",)
SPLIT_SEEDS = {"dev": (0, 1), "test": (100, 101)}
#: one more seed for the configurations that trained well (a clean run on dev; for the
#: held-out family, on its own test seeds), so the clean set is large enough to count
#: false alarms per 100 runs
EXTRA_SEEDS = {"dev": (2,), "test": (102,)}

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "rmsprop")
SCHEDULES = ("constant", "cosine", "step")
LR_SWEEP = {
    "sgd": (0.05, 0.2),
    "momentum": (0.005, 0.02),
    "adam": (1e-3, 3e-3),
    "adamw": (1e-3, 3e-3),
    "rmsprop": (3e-4, 1e-3),
}
WEIGHT_DECAY = {
    "sgd": (0.0, 1e-4),
    "momentum": (0.0, 5e-4),
    "adam": (0.0, 1e-5),
    "adamw": (0.01, 0.05),
    "rmsprop": (0.0, 1e-5),
}
BATCH = {"tabular": 64, "cnn": 32, "resnet": 32, "lstm": 32, "transformer": 32}


@dataclass(frozen=True)
class TrainConfig:
    optimizer: str
    lr: float
    schedule: str = "constant"
    weight_decay: float = 0.0
    act: str = "relu"
    batch: int = 32

    @property
    def key(self) -> str:
        return f"{self.optimizer}-lr{self.lr:g}-{self.schedule}-wd{self.weight_decay:g}-{self.act}"


@dataclass(frozen=True)
class XgbConfig:
    max_depth: int
    eta: float
    subsample: float = 1.0
    min_child_weight: float = 1.0
    reg_lambda: float = 1.0

    @property
    def key(self) -> str:
        return (
            f"d{self.max_depth}-eta{self.eta:g}-sub{self.subsample:g}"
            f"-mcw{self.min_child_weight:g}-l{self.reg_lambda:g}"
        )


def sweep(family: str) -> list[TrainConfig | XgbConfig]:
    """The configurations of a family's clean sweep (deterministic)."""
    if family == "xgboost":
        return [
            XgbConfig(d, eta, sub) for d, eta, sub in itertools.product((2, 3, 4, 6), (0.1, 0.3), (0.8, 1.0))
        ]
    out: list[TrainConfig | XgbConfig] = []
    rotation = itertools.cycle(itertools.product(SCHEDULES, (0, 1)))
    offset = TORCH_FAMILIES.index(family)
    for _ in range(offset):
        next(rotation)
    for opt in OPTIMIZERS:
        for i, lr in enumerate(LR_SWEEP[opt]):
            schedule, wd_index = next(rotation)
            act = (
                "tanh"
                if family == "tabular" and i == 1 and opt in ("adam", "momentum", "rmsprop")
                else "relu"
            )
            out.append(TrainConfig(opt, lr, schedule, WEIGHT_DECAY[opt][wd_index], act, BATCH[family]))
    if family == "tabular":  # more tanh MLPs: SaturatedActivation's family
        out += [
            TrainConfig("adam", 1e-3, "cosine", 0.0, "tanh", 64),
            TrainConfig("adamw", 3e-3, "constant", 0.01, "tanh", 64),
        ]
    return out


@dataclass(frozen=True)
class FaultKind:
    name: str
    what: str
    families: tuple[str, ...]
    #: mild (meant as a near-miss), medium, severe
    grades: tuple[dict[str, Any], dict[str, Any], dict[str, Any]]
    detects: tuple[str, ...]
    tolerated: tuple[str, ...] = ()
    #: rules that must catch it only when the run diverged to NaN/Inf (else tolerated)
    detects_if_diverged: tuple[str, ...] = ()
    #: trace signals whose effect size dates the symptom's onset
    signals: tuple[str, ...] = ("loss",)
    at_start: bool = False
    #: only for configurations with this activation (tanh: saturation)
    act: str | None = None


_ALL_TORCH = ("tabular", "cnn", "lstm", "transformer", "resnet")
_FLOAT_INPUT = ("tabular", "cnn", "resnet")
_SEQ = ("lstm", "transformer")
_CONSEQUENCES = ("LossNotDecreasing", "Overtraining", "Overfit", "OscillatingLoss")

FAULTS: tuple[FaultKind, ...] = (
    FaultKind(
        "corrupt_batch",
        "non-finite values in the input batches (a corrupt record) from the onset",
        _FLOAT_INPUT,
        ({"kind": "outlier", "every": 0}, {"kind": "nan", "every": 0}, {"kind": "inf", "every": 20}),
        ("ExplodingTensor",),
        signals=("nonfinite", "gnorm"),
    ),
    FaultKind(
        "lr_spike",
        "the learning rate multiplied at the onset (a schedule bug)",
        _ALL_TORCH,
        ({"factor": 3.0}, {"factor": 30.0}, {"factor": 1000.0}),
        (),
        tolerated=(
            "WeightUpdateRatio",
            "GradientNormRatio",
            "DeadRelu",
            "SaturatedActivation",
            "VanishingGradient",
            *_CONSEQUENCES,
            "AllZero",
            "UnchangedTensor",
            "TensorVariance",
            "Confusion",
            "ClassImbalance",
        ),
        detects_if_diverged=("ExplodingTensor",),
        signals=("upd", "nonfinite"),
    ),
    FaultKind(
        "stall",
        "the learning rate drops to (nearly) zero at the onset: training stops",
        _ALL_TORCH,
        ({"factor": 0.1}, {"factor": 1e-7}, {"factor": 0.0}),
        ("LossNotDecreasing", "UnchangedTensor", "WeightUpdateRatio"),
        tolerated=("Overtraining", "Overfit"),
        signals=("upd",),
    ),
    FaultKind(
        "freeze",
        "layers stop receiving gradients at the onset (requires_grad turned off)",
        _ALL_TORCH,
        ({"layers": "first"}, {"layers": "all_but_last"}, {"layers": "all"}),
        ("UnchangedTensor", "WeightUpdateRatio"),
        tolerated=("LossNotDecreasing", "Overtraining", "Overfit"),
        signals=("upd",),
    ),
    FaultKind(
        "zero_layer",
        "a layer's weights and bias are overwritten with zeros at the onset (a bad checkpoint load)",
        _ALL_TORCH,
        (
            {"scale": 0.01, "layers": "middle"},
            {"scale": 0.0, "layers": "middle"},
            {"scale": 0.0, "layers": "all"},
        ),
        ("AllZero",),
        tolerated=(
            "VanishingGradient",
            "DeadRelu",
            "UnchangedTensor",
            "WeightUpdateRatio",
            "GradientNormRatio",
            "TensorVariance",
            *_CONSEQUENCES,
        ),
        signals=("wzero", "gnorm"),
    ),
    FaultKind(
        "vanish",
        "an intermediate activation is scaled down by a tiny factor from the onset (a scaling bug): "
        "gradients below it vanish",
        _ALL_TORCH,
        ({"eps": 0.1}, {"eps": 1e-5}, {"eps": 1e-9}),
        ("VanishingGradient", "GradientNormRatio"),
        tolerated=("DeadRelu", "UnchangedTensor", "WeightUpdateRatio", *_CONSEQUENCES),
        signals=("gfirst",),
    ),
    FaultKind(
        "dead_relu",
        "the biases before a ReLU layer are shifted down at the onset, so a share of its units "
        "never activate",
        ("tabular", "cnn", "transformer", "resnet"),
        ({"share": 0.3}, {"share": 0.8}, {"share": 1.0}),
        ("DeadRelu",),
        tolerated=(
            "VanishingGradient",
            "GradientNormRatio",
            "AllZero",
            "UnchangedTensor",
            "WeightUpdateRatio",
            *_CONSEQUENCES,
        ),
        signals=("dead",),
        act="relu",
    ),
    FaultKind(
        "saturate",
        "the weights feeding tanh layers are multiplied at the onset, so the units saturate",
        ("tabular",),
        ({"factor": 2.0}, {"factor": 30.0}, {"factor": 300.0}),
        ("SaturatedActivation",),
        tolerated=(
            "VanishingGradient",
            "GradientNormRatio",
            "TensorVariance",
            "WeightUpdateRatio",
            *_CONSEQUENCES,
        ),
        signals=("sat",),
        act="tanh",
    ),
    FaultKind(
        "poor_init",
        "every weight initialised with a wrong scale",
        _ALL_TORCH,
        ({"gain": 0.5}, {"gain": 0.001}, {"gain": 12.0}),
        ("PoorWeightInitialization",),
        tolerated=(
            "VanishingGradient",
            "ExplodingTensor",
            "SaturatedActivation",
            "DeadRelu",
            "GradientNormRatio",
            "TensorVariance",
            "WeightUpdateRatio",
            *_CONSEQUENCES,
        ),
        signals=("gnorm", "loss"),
        at_start=True,
    ),
    FaultKind(
        "overfit",
        "the sampler repeats a small subset of the training set from the onset (a sharding bug)",
        _ALL_TORCH,
        ({"subset": 512}, {"subset": 48}, {"subset": 12}),
        ("Overfit", "Overtraining"),
        tolerated=("LossNotDecreasing", "OscillatingLoss", "ClassImbalance", "Confusion"),
        signals=("gap",),
    ),
    FaultKind(
        "shuffle_labels",
        "labels are shuffled against their inputs from the onset (a misaligned join)",
        _ALL_TORCH,
        ({"share": 0.1}, {"share": 0.6}, {"share": 1.0}),
        ("LossNotDecreasing",),
        tolerated=("Overtraining", "Overfit", "OscillatingLoss", "Confusion", "ClassImbalance"),
        signals=("loss",),
    ),
    FaultKind(
        "oscillate",
        "from the onset the batch shrinks and the learning rate grows (an unstable regime)",
        _ALL_TORCH,
        ({"batch": 16, "factor": 1.0}, {"batch": 4, "factor": 4.0}, {"batch": 2, "factor": 12.0}),
        ("OscillatingLoss",),
        tolerated=(
            "LossNotDecreasing",
            "Overtraining",
            "Overfit",
            "WeightUpdateRatio",
            "DeadRelu",
            "GradientNormRatio",
            "ClassImbalance",
            "Confusion",
        ),
        detects_if_diverged=("ExplodingTensor",),
        signals=("lossvar",),
    ),
    FaultKind(
        "unnormalized",
        "the input pipeline stops normalising from the onset (raw features, 0-255 pixels)",
        _FLOAT_INPUT,
        ({"level": "mild"}, {"level": "medium"}, {"level": "raw"}),
        ("DataNotNormalized", "CheckInputImages"),
        tolerated=(
            "ExplodingTensor",
            "SaturatedActivation",
            "DeadRelu",
            "VanishingGradient",
            "WeightUpdateRatio",
            "GradientNormRatio",
            *_CONSEQUENCES,
        ),
        signals=("xmean", "xstd"),
    ),
    FaultKind(
        "imbalance",
        "the sampler draws one class far more often than the others from the onset",
        _ALL_TORCH,
        ({"ratio": 3.0}, {"ratio": 30.0}, {"ratio": 300.0}),
        ("ClassImbalance",),
        tolerated=("Confusion", *_CONSEQUENCES),
        signals=("ymax",),
    ),
    FaultKind(
        "confusion",
        "a share of class 1's labels become class 2 from the onset (an annotation bug)",
        _ALL_TORCH,
        ({"share": 0.15}, {"share": 0.6}, {"share": 1.0}),
        ("Confusion",),
        tolerated=("ClassImbalance", *_CONSEQUENCES),
        signals=("yconf",),
    ),
    FaultKind(
        "truncate",
        "the tokenizer truncates sequences to a few tokens from the onset (then pads)",
        _SEQ,
        ({"keep": 16}, {"keep": 5}, {"keep": 1}),
        ("NLPSequenceRatio",),
        tolerated=_CONSEQUENCES,
        signals=("pad",),
    ),
    FaultKind(
        "overpadded",
        "sequences are padded to 3x their length from the onset (content intact)",
        _SEQ,
        ({"pad_to": 48}, {"pad_to": 96}, {"pad_to": 128}),
        ("NLPSequenceRatio",),
        tolerated=_CONSEQUENCES,
        signals=("pad",),
    ),
    FaultKind(
        "weight_decay",
        "every weight is shrunk each step from the onset (a decay applied per step instead of per epoch)",
        _ALL_TORCH,
        ({"keep": 0.999}, {"keep": 0.97}, {"keep": 0.85}),
        ("TensorVariance",),
        tolerated=(
            "VanishingGradient",
            "GradientNormRatio",
            "DeadRelu",
            "WeightUpdateRatio",
            "AllZero",
            "UnchangedTensor",
            *_CONSEQUENCES,
        ),
        signals=("wvar",),
    ),
    # XGBoost
    FaultKind(
        "xgb_deep",
        "trees grown far too deep without regularisation on a small noisy training set",
        ("xgboost",),
        ({"max_depth": 7}, {"max_depth": 11}, {"max_depth": 16}),
        ("TreeDepth",),
        tolerated=("Overfit", "Overtraining", "LossNotDecreasing"),
        signals=(),
        at_start=True,
    ),
    FaultKind(
        "xgb_leak",
        "a training-only feature that leaks the label (noisy copy), absent from the validation data",
        ("xgboost",),
        ({"noise": 2.0}, {"noise": 0.5}, {"noise": 0.05}),
        ("FeatureImportanceOverweight",),
        tolerated=("Overfit", "Overtraining", "LossNotDecreasing"),
        signals=(),
        at_start=True,
    ),
)
FAULTS_BY_NAME = {f.name: f for f in FAULTS}


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    split: str
    family: str
    seed: int
    config: dict[str, Any]
    #: None: a clean sweep run
    fault: str | None = None
    grade: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    #: training step (boosting round) the fault is switched on
    onset: int | None = None
    #: the clean run this one equals up to the onset
    twin: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(raw: dict[str, Any]) -> RunSpec:
        return RunSpec(**raw)


def config_key(family: str, config: dict[str, Any]) -> str:
    return XgbConfig(**config).key if family == "xgboost" else TrainConfig(**config).key


def clean_id(family: str, key: str, seed: int) -> str:
    return f"clean-{family}-{key}-s{seed}"


def split_families(split: str) -> tuple[str, ...]:
    if split == "dev":
        return DEV_FAMILIES
    return (*DEV_FAMILIES, *HELD_OUT_FAMILIES)


def clean_specs(split: str, families: tuple[str, ...] | None = None) -> list[RunSpec]:
    out = []
    for family in families or split_families(split):
        for cfg in sweep(family):
            for seed in SPLIT_SEEDS[split]:
                out.append(RunSpec(clean_id(family, cfg.key, seed), split, family, seed, asdict(cfg)))
    return out


def extra_clean_specs(split: str, good: dict[str, set[str]]) -> list[RunSpec]:
    """``good``: family -> keys of its configurations that trained well."""
    out = []
    for family in split_families(split):
        for cfg in sweep(family):
            if cfg.key in good.get(family, set()):
                for seed in EXTRA_SEEDS[split]:
                    out.append(RunSpec(clean_id(family, cfg.key, seed), split, family, seed, asdict(cfg)))
    return out


def _rng_for(*parts: Any) -> int:
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return int(digest[:12], 16)


#: a fault kind runs on at most this many of its families per split (drawn per split, so
#: that across the two splits most families see every fault; the held-out family always
#: gets its faults in the test split): the corpus must fit CI-machine hours, not days
FAMILIES_PER_FAULT = 3


def fault_families(kind: FaultKind, split: str) -> list[str]:
    import random

    families = [f for f in kind.families if f in split_families(split)]
    if len(families) <= FAMILIES_PER_FAULT:
        return families
    fixed = [f for f in families if f in HELD_OUT_FAMILIES]
    others = [f for f in families if f not in fixed]
    random.Random(_rng_for("families", kind.name)).shuffle(others)
    # dev takes the first ones, test continues the rotation
    start = 0 if split == "dev" else FAMILIES_PER_FAULT
    picked = [others[(start + i) % len(others)] for i in range(FAMILIES_PER_FAULT - len(fixed))]
    return sorted({*fixed, *picked}, key=families.index)


def fault_specs(split: str, clean_twins: dict[str, list[RunSpec]], per_cell: int = 1) -> list[RunSpec]:
    """Each fault kind x grade on its families of the split, ``per_cell`` runs each, on drawn twins.

    ``clean_twins``: family -> the split's clean runs of that family (the draw is
    deterministic given that list, so a resumed generation plans the same runs).
    """
    import random

    out = []
    for kind in FAULTS:
        for family in fault_families(kind, split):
            twins = [
                t for t in clean_twins.get(family, []) if kind.act is None or t.config.get("act") == kind.act
            ]
            if not twins:
                continue
            steps = XGB_ROUNDS if family == "xgboost" else STEPS
            for grade, params in enumerate(kind.grades):
                for rep in range(per_cell):
                    rng = random.Random(_rng_for(split, kind.name, family, grade, rep))
                    twin = twins[rng.randrange(len(twins))]
                    onset = 0 if kind.at_start else rng.randrange(int(0.1 * steps), int(0.7 * steps) + 1)
                    run_id = f"{kind.name}-g{grade}-{family}-r{rep}-{split}"
                    out.append(
                        RunSpec(
                            run_id,
                            split,
                            family,
                            twin.seed,
                            twin.config,
                            kind.name,
                            grade,
                            dict(params),
                            onset,
                            twin.run_id,
                        )
                    )
    return out
