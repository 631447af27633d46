"""From an SSD head's outputs to detections, in plain torch (torchvision's ops do not load with every
torch build): box decoding (the inverse of DALI's fn.box_encoder, see anchors.py), per-class NMS,
and per-image detections (softmax, score threshold, top-k, NMS, cap).

Nothing here changes torch's global settings (such as torch.set_num_threads): the caller decides.
"""

from __future__ import annotations

import torch

from hydrali.tasks.detection.anchors import BOX_ENCODER_MEANS, BOX_ENCODER_STDS
from hydrali.tasks.detection.layout import BOX_VALUES, FIRST_OBJECT_LABEL

# NMS compares every candidate with every other, per image: images are processed in chunks holding
# at most this many pairs, so that memory stays bounded whatever pre_nms_top_k and the batch size.
NMS_PAIRS_PER_CHUNK = 1 << 20


def _decode(loc: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """ltrb boxes from offsets loc [..., 4] against ltrb anchors [..., 4] (broadcast)."""
    anchors = anchors.to(device=loc.device, dtype=loc.dtype)
    anchor_centre = 0.5 * (anchors[..., :2] + anchors[..., 2:])
    anchor_size = anchors[..., 2:] - anchors[..., :2]
    raw = loc * loc.new_tensor(BOX_ENCODER_STDS) + loc.new_tensor(BOX_ENCODER_MEANS)
    centre = anchor_centre + raw[..., :2] * anchor_size
    half = 0.5 * anchor_size * torch.exp(raw[..., 2:])
    return torch.cat([centre - half, centre + half], dim=-1)


def decode_boxes(loc: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """[B, N, 4] ltrb boxes (normalized, not clipped) from box offsets loc [B, N, 4], as DALI's
    fn.box_encoder(**box_encoder_args(anchors)) emits them, relative to anchors [N, 4] ltrb."""
    return _decode(loc, anchors)


def _intersection_and_area_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., M, N] intersection areas and sums of the two areas of ltrb boxes a [..., M, 4], b [..., N, 4]."""
    al, at, ar, ab = (v.unsqueeze(-1) for v in a.unbind(-1))  # [..., M, 1] each
    bl, bt, br, bb = (v.unsqueeze(-2) for v in b.unbind(-1))  # [..., 1, N] each
    inter = (torch.minimum(ar, br) - torch.maximum(al, bl)).clamp_(min=0)
    inter.mul_((torch.minimum(ab, bb) - torch.maximum(at, bt)).clamp_(min=0))
    return inter, (ar - al) * (ab - at) + (br - bl) * (bb - bt)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[..., M, N] IoU of ltrb boxes a [..., M, 4] with b [..., N, 4] (0 where the union is empty)."""
    inter, area_sum = _intersection_and_area_sum(a, b)
    union = area_sum.sub_(inter)
    return torch.where(union > 0, inter / union.clamp(min=torch.finfo(union.dtype).tiny), torch.zeros_like(inter))


def _overlapping(boxes: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """[..., n, n] bool: IoU > iou_threshold between ltrb boxes [..., n, 4], without a division:
    inter / (A + B - inter) > t  <=>  inter * (1 + t) > t * (A + B)  (false for empty boxes)."""
    inter, area_sum = _intersection_and_area_sum(boxes, boxes)
    return inter.mul_(1 + iou_threshold) > area_sum.mul_(iou_threshold)


def _separate_classes(boxes: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """Boxes shifted by class * (coordinate span + 1), so that boxes of different classes never overlap.

    The shift costs precision: coordinates round to the float spacing at 2 * K for normalized boxes
    (1.5e-5 in float32 for K = 80: a 500th of a pixel at 128 px), which only matters at IoU == threshold.
    """
    low, high = boxes.min(), boxes.max()
    return boxes - low + classes.to(boxes.dtype).unsqueeze(-1) * (high - low + 1)


def _greedy_keep(overlaps: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """[B, n] greedy NMS mask for candidates sorted by decreasing score: candidate j is kept unless an
    earlier kept candidate i overlaps it (overlaps [B, n, n] bool).

    Solved as a fixed point, all images at once: keep[j] = candidate[j] and no kept i < j overlaps j.
    Each pass fixes at least one more leading entry, so it ends after at most n passes, usually a few.
    """
    suppressors = torch.triu(overlaps, diagonal=1).to(torch.float32)
    keep = candidates
    for _ in range(overlaps.shape[-1] + 1):
        suppressed = torch.bmm(keep.unsqueeze(1).to(torch.float32), suppressors).squeeze(1) > 0
        updated = candidates & ~suppressed
        if torch.equal(updated, keep):
            break
        keep = updated
    return keep


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Indices of the boxes [n, 4] ltrb kept by per-class greedy NMS (a box is dropped when a
    higher-scoring kept box of its class has IoU > iou_threshold), by decreasing score."""
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=boxes.device)
    order = torch.argsort(scores, descending=True, stable=True)
    separated = _separate_classes(boxes[order], classes[order])
    overlaps = _overlapping(separated, iou_threshold)
    all_candidates = torch.ones(1, len(order), dtype=torch.bool, device=boxes.device)
    return order[_greedy_keep(overlaps.unsqueeze(0), all_candidates)[0]]


def _top_candidates(
    loc: torch.Tensor, logits: torch.Tensor, anchors: torch.Tensor, pre_nms_top_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per image, the pre_nms_top_k best (anchor, class) pairs over all foreground classes, by
    decreasing score: boxes [B, k, 4] (clipped to [0, 1]), scores [B, k], labels [B, k] in 1..K."""
    probs = torch.softmax(logits.float(), dim=-1)
    foreground = probs[..., FIRST_OBJECT_LABEL:]  # the logits before the first object's are background's
    batch, num_anchors, num_classes = foreground.shape
    k = min(pre_nms_top_k, num_anchors * num_classes)
    scores, flat_index = foreground.reshape(batch, -1).topk(k, dim=1, sorted=True)
    anchor_index = torch.div(flat_index, num_classes, rounding_mode="floor")
    labels = flat_index % num_classes + FIRST_OBJECT_LABEL
    picked_loc = loc.float().gather(1, anchor_index.unsqueeze(-1).expand(-1, -1, BOX_VALUES))
    picked_anchors = anchors.to(loc.device).float()[anchor_index]
    boxes = _decode(picked_loc, picked_anchors).clamp(0.0, 1.0)
    return boxes, scores, labels


def _drop_trailing_below(
    score_threshold: float, boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The candidates (sorted by decreasing score) cut to the longest per-image run above the threshold:
    NMS costs grow with the square of their number."""
    width = int((scores > score_threshold).sum(dim=1).max()) if scores.numel() else 0
    return boxes[:, :width], scores[:, :width], labels[:, :width]


def _nms_mask(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    labels: torch.Tensor,
    score_threshold: float,
    iou_threshold: float,
    max_detections: int,
) -> torch.Tensor:
    """[B, k] mask of the candidates (sorted by decreasing score) that survive the score threshold,
    per-class NMS and the cap of max_detections per image; computed over chunks of images of at most
    NMS_PAIRS_PER_CHUNK candidate pairs (bounded memory)."""
    if scores.numel() == 0:
        return scores > score_threshold
    chunk = max(1, NMS_PAIRS_PER_CHUNK // scores.shape[1] ** 2)
    masks = []
    for start in range(0, len(scores), chunk):
        images = slice(start, start + chunk)
        separated = _separate_classes(boxes[images], labels[images])
        keep = _greedy_keep(_overlapping(separated, iou_threshold), scores[images] > score_threshold)
        masks.append(keep & (keep.cumsum(dim=1) <= max_detections))
    return torch.cat(masks)


def decode_detections(
    loc: torch.Tensor,
    logits: torch.Tensor,
    anchors: torch.Tensor,
    *,
    score_threshold: float,
    iou_threshold: float,
    pre_nms_top_k: int,
    max_detections: int,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Detections per image from a head's outputs (loc [B, N, 4] offsets, logits [B, N, 1 + K] with
    index 0 = background, anchors [N, 4] ltrb): for each image (boxes [M, 4] ltrb normalized to
    [0, 1], scores [M], labels [M] in 1..K), M <= max_detections, by decreasing score.

    Candidates are (anchor, class) pairs with softmax score > score_threshold, the pre_nms_top_k best
    per image; then per-class NMS at iou_threshold.
    """
    with torch.no_grad():
        boxes, scores, labels = _top_candidates(loc, logits, anchors, pre_nms_top_k)
        boxes, scores, labels = _drop_trailing_below(score_threshold, boxes, scores, labels)
        keep = _nms_mask(boxes, scores, labels, score_threshold, iou_threshold, max_detections)
        return [(boxes[i][keep[i]], scores[i][keep[i]], labels[i][keep[i]]) for i in range(len(boxes))]
