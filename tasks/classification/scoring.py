"""Classification scored outside any framework (hydrali eval and predict): the class logits a backend's trained
network returns, turned into top-1 accuracy, per-class precision, recall and accuracy, a confusion matrix (with
scikit-learn) and top-k predictions, the same for every backend."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from hydrali.core.data.image_files import images

CONFUSION_PICTURE = "confusion_matrix.png"
PREDICTIONS_FILE = "predictions.csv"


def softmax(logits: np.ndarray) -> np.ndarray:
    """Class probabilities of each row of `logits`."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


class ClassificationScores:
    """Accumulates the predicted and true class of every image scored, then reports on them."""

    def __init__(self, classes: tuple[str, ...]):
        self.classes = tuple(classes)
        self._predicted: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []

    def update(self, predictions: dict, batch: dict) -> None:
        """Add a batch: the network's `logits` and the recipe's `labels`."""
        self._predicted.append(np.argmax(predictions["logits"], axis=1))
        self._labels.append(np.asarray(batch["labels"]).reshape(-1).astype(np.int64))

    @property
    def images(self) -> int:
        """The number of images scored."""
        return int(sum(len(p) for p in self._predicted))

    def confusion(self) -> np.ndarray:
        """The confusion matrix: row = true class, column = predicted class, counts of images."""
        from sklearn.metrics import confusion_matrix

        labels = np.concatenate(self._labels)
        return confusion_matrix(labels, np.concatenate(self._predicted), labels=range(len(self.classes)))

    def metrics(self) -> dict[str, float]:
        """The task's metric (acc: top-1 accuracy over every image), named as in training."""
        labels, predicted = np.concatenate(self._labels), np.concatenate(self._predicted)
        return {"acc": float(np.mean(labels == predicted))}

    def per_class(self) -> dict[str, dict[str, float]]:
        """For each class: precision, recall (its accuracy: of its images, those predicted right) and support."""
        from sklearn.metrics import precision_recall_fscore_support

        labels, predicted = np.concatenate(self._labels), np.concatenate(self._predicted)
        precision, recall, _, support = precision_recall_fscore_support(
            labels, predicted, labels=range(len(self.classes)), zero_division=0
        )
        return {
            name: {"precision": float(p), "recall": float(r), "support": int(n)}
            for name, p, r, n in zip(self.classes, precision, recall, support)
        }

    def report(self) -> dict:
        """What metrics.json holds besides the metrics: the per-class figures and the confusion matrix."""
        return {
            "classes": list(self.classes),
            "per_class": self.per_class(),
            "confusion_matrix": self.confusion().tolist(),
        }

    def per_class_table(self) -> list[str]:
        """The per-class figures as text lines, for the terminal."""
        width = max(len("class"), *(len(c) for c in self.classes))
        lines = [f"{'class':<{width}}  precision  recall  images"]
        for name, row in self.per_class().items():
            lines.append(f"{name:<{width}}  {row['precision']:>9.4f}  {row['recall']:>6.4f}  {row['support']:>6d}")
        return lines

    def write_pictures(self, folder: Path) -> list[Path]:
        """The confusion matrix as a picture in `folder` (scikit-learn's display, matplotlib's Agg)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from sklearn.metrics import ConfusionMatrixDisplay

        size = max(4.0, 0.5 * len(self.classes) + 2)
        figure, axes = plt.subplots(figsize=(size, size))
        ConfusionMatrixDisplay(self.confusion(), display_labels=list(self.classes)).plot(
            ax=axes, colorbar=False, xticks_rotation="vertical"
        )
        axes.set_title(f"{images(self.images)}, accuracy {self.metrics()['acc']:.4f}")
        path = folder / CONFUSION_PICTURE
        figure.tight_layout()
        figure.savefig(path, dpi=100)
        plt.close(figure)
        return [path]


class ClassificationPredictions:
    """Writes the top-k classes of each image, with their probabilities, to predictions.csv."""

    def __init__(self, classes: tuple[str, ...], top_k: int):
        self.classes = tuple(classes)
        self.top_k = max(1, min(top_k, len(self.classes)))
        self.rows: list[list] = []

    def update(self, files: list[str], predictions: dict, batch: dict) -> None:
        """Add the images `files` (in the batch's order) and the network's `logits` for them."""
        probabilities = softmax(predictions["logits"].astype(np.float64))
        best = np.argsort(-probabilities, axis=1, kind="stable")[:, : self.top_k]
        for name, order, row in zip(files, best, probabilities):
            self.rows.append([name, *(value for k in order for value in (self.classes[k], f"{row[k]:.6f}"))])

    def write(self, folder: Path) -> list[Path]:
        """predictions.csv in `folder`: file, then class_1, score_1, ..., class_k, score_k (best first)."""
        path = folder / PREDICTIONS_FILE
        with path.open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["file", *(f"{what}_{k}" for k in range(1, self.top_k + 1) for what in ("class", "score"))])
            writer.writerows(self.rows)
        return [path]
