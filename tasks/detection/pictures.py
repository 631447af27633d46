"""Pictures of what the detector does: validation images with the ground truth beside the predictions (PNG)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from PIL import Image, ImageDraw

MIN_PANEL_SIDE = 256  # small images are enlarged to at least this side, so that labels stay readable
MIN_SCORE_DRAWN = 0.3  # predictions scored lower are not drawn (they still count in mAP)
TRUTH_COLOUR = (40, 220, 40)
PREDICTION_COLOUR = (255, 60, 40)
GAP = 8  # pixels between panels and between rows
SHEET_COLOUR = (255, 255, 255)  # the PNG's paper, around and between the panels
LINE_WIDTH = 2
HEADER = 16  # pixels above each row for its titles


def _panel(image: Image.Image, boxes: Sequence[tuple[Sequence[float], str]], colour) -> Image.Image:
    """The image enlarged to MIN_PANEL_SIDE with each (pixel xywh box, caption) drawn on it."""
    zoom = max(1.0, MIN_PANEL_SIDE / max(image.size))
    panel = image.convert("RGB").resize((round(image.width * zoom), round(image.height * zoom)))
    draw = ImageDraw.Draw(panel)
    for (x, y, w, h), caption in boxes:
        left, top = x * zoom, y * zoom
        draw.rectangle([left, top, left + w * zoom, top + h * zoom], outline=colour, width=LINE_WIDTH)
        draw.text((left + LINE_WIDTH, max(0.0, top - 11)), caption, fill=colour)
    return panel


def draw_predictions(images: Sequence[Mapping], path: Path, title: str = "") -> Path:
    """Write one PNG: a row per image, ground truth on the left, predictions (score >= MIN_SCORE_DRAWN) on the right.

    Each item of `images`: {"file": image path, "truth": [(xywh, name)], "predictions": [(xywh, name, score)]}.
    """
    rows = []
    for item in images:
        with Image.open(item["file"]) as image:
            truth = _panel(image, item["truth"], TRUTH_COLOUR)
            shown = [
                (box, f"{name} {score:.2f}") for box, name, score in item["predictions"] if score >= MIN_SCORE_DRAWN
            ]
            predicted = _panel(image, shown, PREDICTION_COLOUR)
        rows.append((truth, predicted))
    width = max((a.width + b.width for a, b in rows), default=MIN_PANEL_SIDE) + 3 * GAP
    height = sum(max(a.height, b.height) + HEADER + GAP for a, b in rows) + GAP
    sheet = Image.new("RGB", (width, max(height, HEADER + GAP)), SHEET_COLOUR)
    draw = ImageDraw.Draw(sheet)
    top = GAP
    for truth, predicted in rows:
        draw.text((GAP, top), f"ground truth {title}".strip(), fill=(0, 0, 0))
        draw.text((2 * GAP + truth.width, top), f"predicted (score >= {MIN_SCORE_DRAWN})", fill=(0, 0, 0))
        sheet.paste(truth, (GAP, top + HEADER))
        sheet.paste(predicted, (2 * GAP + truth.width, top + HEADER))
        top += max(truth.height, predicted.height) + HEADER + GAP
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    sheet.save(tmp, format="PNG")
    tmp.replace(path)
    return path
