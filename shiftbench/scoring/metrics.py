"""WILDS-style evaluation metrics, named in one vocabulary.

Per evaluated split: ``count``, ``acc_avg`` (accuracy over examples), ``loss_avg`` (mean
cross-entropy), ``acc_wg`` (accuracy of the worst non-empty group; its ``group`` is that group),
and for every group of the benchmark ``acc_group:<group>`` and ``count_group:<group>``. A group
with no example in the split has count 0 and accuracy NULL and never counts as the worst group
(WILDS reports groups the same way). Across splits: ``acc_gap:<id split>`` (ID accuracy minus this
split's, positive when OOD is worse) and ``acc_relative:<id split>`` (this split's accuracy over
the ID one: BREEDS's relative accuracy, target over source), with its 95 % bootstrap interval
(``acc_relative_low:<id split>``, ``acc_relative_high:<id split>``). ``test`` is compared with ``id_test``,
or with ``id_val`` when the benchmark has no ``id_test`` (ConDS); ``val`` with ``id_val``.

Per class (:func:`class_metrics`): ``acc_class:<name>`` (recall of that class; BREEDS: per-superclass
accuracy), ``acc_balanced`` (mean recall over the classes present, as scikit-learn's
``balanced_accuracy_score``) and ``f1_macro`` (mean F1 over the classes present in the labels or the
predictions, as ``f1_score(average="macro")``). With class probabilities (:func:`calibration_metrics`):
``ece``, the expected calibration error over 15 equal-width confidence bins (Guo et al., 2017), and
``acc_pairwise`` (:func:`pairwise_accuracy`: BREEDS Appendix A.7.2's average-case binary task, over every pair of
classes).
Over any subset of a split (:func:`subset_accuracy`): ``acc_subset:<name>`` (ConDS: unseen values,
rare values, SC counterexamples).

The grouping is the benchmark's own ``group`` column, written by the split builders (BREEDS
subclass, MetaShift community, ConDS cell), so training and the split definition share it.
Plain numpy: the training job imports this module, and it must run without polars.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Every metric name this module writes: these, and the per-group, per-class and across-split families.
METRIC_NAMES = ("count", "acc_avg", "loss_avg", "acc_wg", "acc_balanced", "f1_macro", "ece", "acc_pairwise")
METRIC_PREFIXES = (
    *("acc_group:", "count_group:", "acc_class:", "acc_gap:", "acc_relative:", "acc_subset:"),
    *("acc_relative_low:", "acc_relative_high:"),  # the relative accuracy's 95 % bootstrap interval
)
BOOTSTRAP_DRAWS, BOOTSTRAP_SEED = 10_000, 0
# OOD split -> its ID reference, first evaluated one wins (ConDS has no id_test: test vs id_val).
ID_REFERENCE = {"test": ("id_test", "id_val"), "val": ("id_val",)}


@dataclass(frozen=True)
class Metric:
    eval_split: str
    metric: str
    group: str | None
    value: float | None


def split_metrics(
    eval_split: str,
    y_true: np.ndarray,
    y_pred: np.ndarray,
    losses: np.ndarray,
    group_index: np.ndarray,
    group_names: Sequence[str],
) -> list[Metric]:
    """The metrics of one split; ``group_index[i]`` indexes ``group_names`` (all groups of the benchmark)."""
    n = int(y_true.shape[0])
    if not (y_pred.shape[0] == losses.shape[0] == group_index.shape[0] == n):
        raise ValueError("y_true, y_pred, losses and group_index must have the same length")
    correct = (y_true == y_pred).astype(np.float64)
    out = [Metric(eval_split, "count", None, float(n))]
    out.append(Metric(eval_split, "acc_avg", None, float(correct.mean()) if n else None))
    out.append(Metric(eval_split, "loss_avg", None, float(losses.astype(np.float64).mean()) if n else None))
    counts = np.bincount(group_index, minlength=len(group_names)) if n else np.zeros(len(group_names), np.int64)
    hits = np.bincount(group_index, weights=correct, minlength=len(group_names)) if n else np.zeros(len(group_names))
    worst: tuple[float, str] | None = None
    per_group = []
    for index, name in enumerate(group_names):
        count = int(counts[index])
        accuracy = float(hits[index] / count) if count else None
        per_group.append(Metric(eval_split, f"acc_group:{name}", name, accuracy))
        per_group.append(Metric(eval_split, f"count_group:{name}", name, float(count)))
        if accuracy is not None and (worst is None or accuracy < worst[0]):
            worst = (accuracy, name)  # ties keep the first group in the benchmark's order
    out.append(Metric(eval_split, "acc_wg", worst[1] if worst else None, worst[0] if worst else None))
    return out + per_group


def class_metrics(eval_split: str, y_true: np.ndarray, y_pred: np.ndarray, class_names: Sequence[str]) -> list[Metric]:
    """Per-class accuracy, balanced accuracy and macro F1 of one split."""
    k = len(class_names)
    support = np.bincount(y_true, minlength=k)[:k]
    predicted = np.bincount(y_pred, minlength=k)[:k]
    true_positive = np.bincount(y_true[y_true == y_pred], minlength=k)[:k]
    out = []
    recalls = []
    for index, name in enumerate(class_names):
        recall = float(true_positive[index] / support[index]) if support[index] else None
        out.append(Metric(eval_split, f"acc_class:{name}", name, recall))
        if recall is not None:
            recalls.append(recall)
    out.append(Metric(eval_split, "acc_balanced", None, float(np.mean(recalls)) if recalls else None))
    f1 = []
    for index in range(k):
        if not support[index] and not predicted[index]:
            continue  # a class neither present nor predicted does not enter the macro average
        precision = true_positive[index] / predicted[index] if predicted[index] else 0.0
        recall = true_positive[index] / support[index] if support[index] else 0.0
        f1.append(2 * precision * recall / (precision + recall) if precision + recall else 0.0)
    out.append(Metric(eval_split, "f1_macro", None, float(np.mean(f1)) if f1 else None))
    return out


ECE_BINS = 15


def calibration_metrics(eval_split: str, y_true: np.ndarray, probabilities: np.ndarray) -> list[Metric]:
    """Expected calibration error: sum over confidence bins of |accuracy - confidence| weighted by size."""
    n = int(y_true.shape[0])
    if not n:
        return [Metric(eval_split, "ece", None, None)]
    confidence = probabilities.max(axis=1)
    correct = (probabilities.argmax(axis=1) == y_true).astype(np.float64)
    # Bin b holds confidences in (b/B, (b+1)/B]; a confidence of exactly 0 goes to the first bin.
    bins = np.clip(np.ceil(confidence * ECE_BINS).astype(np.int64) - 1, 0, ECE_BINS - 1)
    ece = 0.0
    for b in range(ECE_BINS):
        members = bins == b
        if members.any():
            ece += members.sum() / n * abs(correct[members].mean() - confidence[members].mean())
    return [Metric(eval_split, "ece", None, float(ece))]


def pairwise_accuracy(eval_split: str, y_true: np.ndarray, probabilities: np.ndarray) -> Metric:
    """BREEDS Appendix A.7.2: on the images of a pair of classes, the prediction is the one of the two with the higher
    probability (a tie is wrong); the mean of that accuracy over every pair with images, each pair weighing the same
    (the paper estimates it over random pairs; here every pair is counted once). NULL with fewer than two classes."""
    n, k = probabilities.shape if probabilities.ndim == 2 else (0, 0)
    if n == 0 or k < 2:
        return Metric(eval_split, "acc_pairwise", None, None)
    own = probabilities[np.arange(n), y_true][:, None]
    beats = (own > probabilities).astype(np.float64)  # [n, k]: this image's class beats class j
    members = np.zeros((k, n))
    members[y_true, np.arange(n)] = 1.0
    wins = members @ beats  # [a, b]: images of class a whose a beats b
    sizes = members.sum(axis=1)
    first, second = np.triu_indices(k, 1)
    images = sizes[first] + sizes[second]
    kept = images > 0
    accuracy = (wins[first, second] + wins[second, first])[kept] / images[kept]
    return Metric(eval_split, "acc_pairwise", None, float(accuracy.mean()) if kept.any() else None)


def subset_accuracy(eval_split: str, name: str, y_true: np.ndarray, y_pred: np.ndarray, mask: np.ndarray) -> Metric:
    """Accuracy over the examples of ``mask`` (NULL when there are none)."""
    chosen = int(mask.sum())
    value = float((y_true[mask] == y_pred[mask]).mean()) if chosen else None
    return Metric(eval_split, f"acc_subset:{name}", name, value)


def gap_metrics(metrics: Sequence[Metric]) -> list[Metric]:
    """ID-vs-OOD comparisons for every OOD split whose ID reference was evaluated too."""
    accuracy = {m.eval_split: m.value for m in metrics if m.metric == "acc_avg"}
    count = {m.eval_split: m.value or 0.0 for m in metrics if m.metric == "count"}
    out = []
    for ood, references in ID_REFERENCE.items():
        reference = next((r for r in references if accuracy.get(r) is not None), None)
        ood_acc = accuracy.get(ood)
        if ood_acc is None or reference is None:
            continue
        id_acc = accuracy[reference]
        assert id_acc is not None
        out.append(Metric(ood, f"acc_gap:{reference}", None, id_acc - ood_acc))
        out.append(Metric(ood, f"acc_relative:{reference}", None, ood_acc / id_acc if id_acc > 0 else None))
        low, high = relative_accuracy_interval(count.get(reference, 0), id_acc, count.get(ood, 0), ood_acc)
        out.append(Metric(ood, f"acc_relative_low:{reference}", None, low))
        out.append(Metric(ood, f"acc_relative_high:{reference}", None, high))
    return out


def relative_accuracy_interval(
    n_id: float, id_acc: float, n_ood: float, ood_acc: float, draws: int = BOOTSTRAP_DRAWS
) -> tuple[float | None, float | None]:
    """The 95 % bootstrap interval of OOD over ID accuracy (BREEDS Figure 6 and Tables 22-23), the two test sets
    resampled independently: resampling a split's examples with replacement draws its correct count from
    Binomial(n, accuracy), so the counts are drawn so (the same distribution, without the predictions); percentiles
    2.5 and 97.5 of the ratio, from a fixed seed (the same bytes every run). None without examples on either side."""
    n_id, n_ood = int(n_id), int(n_ood)
    if n_id < 1 or n_ood < 1:
        return None, None
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    id_draws = rng.binomial(n_id, min(max(id_acc, 0.0), 1.0), draws) / n_id
    ood_draws = rng.binomial(n_ood, min(max(ood_acc, 0.0), 1.0), draws) / n_ood
    kept = id_draws > 0
    if not kept.any():
        return None, None
    low, high = np.percentile(ood_draws[kept] / id_draws[kept], [2.5, 97.5])
    return float(low), float(high)


def value_of(metrics: Sequence[Metric], eval_split: str, metric: str) -> float | None:
    for m in metrics:
        if m.eval_split == eval_split and m.metric == metric:
            return m.value
    return None
