"""pipeline=small_images (tasks/classification/recipes.py), on the CPU: training pads, crops a random window, flips
and cuts a square out as its options say, and nothing else; validation is the decoded image normalized.

Each image is its own class, so a sample's label names the file it came from whatever the reader's shuffle."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf
from PIL import Image

from hydrali.core.data.pipelines import Source, make_pipeline

SIDE, IMAGES, PAD, CUTOUT = 32, 6, 4, 10
PLAIN = ("pipeline.options.pad=0", "pipeline.options.flip_probability=0", "pipeline.options.cutout=0")


@pytest.fixture
def photos(tmp_path):
    """(root with train/<class>/<one jpeg>, the images as PIL decodes them: uint8 HWC, by label)."""
    rng = np.random.default_rng(0)
    decoded = []
    for label in range(IMAGES):
        folder = tmp_path / "train" / f"c{label}"
        folder.mkdir(parents=True)
        smooth = np.kron(rng.integers(0, 256, (SIDE // 4, SIDE // 4, 3)), np.ones((4, 4, 1)))  # photo-like blocks
        Image.fromarray(smooth.astype(np.uint8)).save(folder / "image.jpg", quality=95)
        decoded.append(np.asarray(Image.open(folder / "image.jpg").convert("RGB")))
    return tmp_path, decoded


def _run(cfg, root, is_training: bool, layout: str = "HWC", seed: int = 11):
    """(images, labels) of one batch of every image of the small_images recipe composed as `cfg` says."""
    pipe = make_pipeline(
        cfg.pipeline.recipe,
        OmegaConf.to_container(cfg.pipeline.options, resolve=True),
        batch_size=IMAGES,
        num_threads=1,
        device_id=None,
        seed=seed,
        prefetch_queue_depth=1,
        source=Source(str(root / "train"), 0, 1, is_training),
        device="cpu",
        layout=layout,
        image_size=SIDE,
        dtype="float",
        hw_decoder_load=0.0,
        num_classes=IMAGES,
    )
    pipe.build()
    images, labels = pipe.run()
    return np.stack([np.asarray(images[i]) for i in range(IMAGES)]), np.asarray(labels.as_array()).reshape(-1)


def _normalized(cfg, uint8_hwc: np.ndarray) -> np.ndarray:
    """An HWC uint8 image normalized with the recipe's mean and std (given in [0, 1])."""
    mean = np.asarray(cfg.pipeline.options.mean) * 255
    std = np.asarray(cfg.pipeline.options.std) * 255
    return (uint8_hwc.astype(np.float32) - mean) / std


@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_training_and_validation_give_image_size_sides_in_the_backends_layout(make_cfg, photos, layout):
    root, _ = photos
    cfg = make_cfg("pipeline=small_images", "pipeline.options.cutout=8")
    expected = (IMAGES, SIDE, SIDE, 3) if layout == "HWC" else (IMAGES, 3, SIDE, SIDE)
    for is_training in (True, False):
        assert _run(cfg, root, is_training, layout)[0].shape == expected


@pytest.mark.parametrize("is_training", [True, False])
def test_without_pad_flip_or_cutout_the_output_is_the_decoded_image_normalized(make_cfg, photos, is_training):
    root, decoded = photos
    cfg = make_cfg("pipeline=small_images", *PLAIN)
    images, labels = _run(cfg, root, is_training)
    assert sorted(labels) == list(range(IMAGES))
    for image, label in zip(images, labels):
        np.testing.assert_allclose(image, _normalized(cfg, decoded[label]), atol=1e-5)


def test_validation_ignores_the_training_augmentations(make_cfg, photos):
    root, decoded = photos
    cfg = make_cfg("pipeline=small_images", "pipeline.options.flip_probability=1", f"pipeline.options.cutout={CUTOUT}")
    images, labels = _run(cfg, root, False)
    for image, label in zip(images, labels):
        np.testing.assert_allclose(image, _normalized(cfg, decoded[label]), atol=1e-5)


def test_a_flip_probability_of_one_mirrors_every_image(make_cfg, photos):
    root, decoded = photos
    cfg = make_cfg("pipeline=small_images", "pipeline.options.pad=0", "pipeline.options.cutout=0")
    cfg.pipeline.options.flip_probability = 1.0
    images, labels = _run(cfg, root, True)
    for image, label in zip(images, labels):
        np.testing.assert_allclose(image, _normalized(cfg, decoded[label][:, ::-1]), atol=1e-5)


def _window_offset(image: np.ndarray, padded: np.ndarray) -> tuple[int, int] | None:
    """The (top, left) of the SIDE x SIDE window of `padded` that equals `image`, if any."""
    for top in range(padded.shape[0] - SIDE + 1):
        for left in range(padded.shape[1] - SIDE + 1):
            if np.allclose(padded[top : top + SIDE, left : left + SIDE], image, atol=1e-5):
                return top, left
    return None


@pytest.mark.parametrize("pad_mode, numpy_mode", [("reflect", "reflect"), ("zero", "constant")])
def test_training_crops_a_random_window_of_the_padded_image(make_cfg, photos, pad_mode, numpy_mode):
    root, decoded = photos
    cfg = make_cfg(
        "pipeline=small_images", *PLAIN, f"pipeline.options.pad={PAD}", f"pipeline.options.pad_mode={pad_mode}"
    )
    images, labels = _run(cfg, root, True)
    offsets = []
    for image, label in zip(images, labels):
        padded = np.pad(decoded[label], ((PAD, PAD), (PAD, PAD), (0, 0)), mode=numpy_mode)
        offset = _window_offset(image, _normalized(cfg, padded))
        assert offset is not None, f"image {label} is no {SIDE} x {SIDE} window of its {pad_mode}-padded self"
        offsets.append(offset)
    assert len(set(offsets)) > 1, f"every image cropped at {offsets[0]}: the window is not random"
    assert any(offset != (PAD, PAD) for offset in offsets)


def _erased_box(image: np.ndarray, reference: np.ndarray) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of the pixels where `image` differs from `reference`, checking that they are
    exactly a rectangle filled with 0 in every channel."""
    differs = np.any(~np.isclose(image, reference, atol=1e-5), axis=-1)
    rows, cols = np.nonzero(differs)
    top, bottom, left, right = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    assert differs[top:bottom, left:right].all(), "the erased pixels are not one rectangle"
    assert differs.sum() == (bottom - top) * (right - left)
    np.testing.assert_array_equal(image[top:bottom, left:right], 0.0)  # the mean colour, after normalization
    return top, bottom, left, right


def test_cutout_erases_one_square_clipped_at_the_border_to_the_mean_colour(make_cfg, photos):
    root, decoded = photos
    cfg = make_cfg("pipeline=small_images", *PLAIN[:2], f"pipeline.options.cutout={CUTOUT}")
    whole = 0
    for seed in (1, 2, 3):  # other places
        images, labels = _run(cfg, root, True, seed=seed)
        for image, label in zip(images, labels):
            top, bottom, left, right = _erased_box(image, _normalized(cfg, decoded[label]))
            for start, end in ((top, bottom), (left, right)):
                assert end - start <= CUTOUT
                assert end - start == CUTOUT or start == 0 or end == SIDE, "a square clipped away from a border"
            whole += (bottom - top, right - left) == (CUTOUT, CUTOUT)
    assert whole > 0, "no square was whole"


def test_validation_resizes_an_image_of_other_sides_to_image_size(make_cfg, photos):
    root, _ = photos
    Image.fromarray(np.zeros((48, 40, 3), np.uint8)).save(root / "train" / "c0" / "image.jpg")
    cfg = make_cfg("pipeline=small_images")
    assert _run(cfg, root, False)[0].shape == (IMAGES, SIDE, SIDE, 3)


@pytest.mark.parametrize(
    "option, message",
    [
        ("pipeline.options.pad=32", "pipeline.options.pad=32: pass 0..31 for data.image_size=32 and pad_mode=reflect"),
        ("pipeline.options.cutout=33", r"pipeline.options.cutout=33: pass 0 \(off\) .. 32"),
    ],
)
def test_a_pad_or_cutout_larger_than_the_image_is_one_line_naming_it(make_cfg, photos, option, message):
    from hydrali.core.errors import HydraliError

    root, _ = photos
    with pytest.raises(HydraliError, match=message):
        _run(make_cfg("pipeline=small_images", option), root, True)
