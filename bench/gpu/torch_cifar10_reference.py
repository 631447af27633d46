"""What a published fast CIFAR-10 recipe reaches on a JPEG folder, outside hydrali: the photos decoded once by PIL
into GPU memory, augmented there (pad 4 and random 32 x 32 crop, flip, 8 x 8 cutout) and trained by a plain torch
loop, so that hydrali's accuracy on the same photos can be told apart from the photos' own ceiling.

The recipe is David Page's 24-epoch one ("How to train your ResNet", 2018; 94% on CIFAR-10's own PNG-quality
pixels): his ResNet-9 (or hydrali's ResNet-18 layout, `--model hydrali_resnet18`), batch 512, SGD with Nesterov
momentum 0.9, weight decay 5e-4 on every parameter, the learning rate linear from 0 to 0.4 at epoch 5 and back to 0
at the last step, bf16 autocast, channels-last. Each repeat prints one line; the table comes last:

    python3 -m hydrali.bench.gpu.torch_cifar10_reference --root /tmp/cifar/cifar --model resnet9 --repeats 2

On the GPU machine only (one GPU); nothing of hydrali runs but its network (model=resnet9, or the ResNet-18 layout).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from multiprocessing import Pool

import numpy as np
import torch
from PIL import Image
from torch import nn

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)  # CIFAR-10's per-channel mean and deviation (of the PNG-quality pixels)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


def _decode(path: str) -> bytes:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"), dtype=np.uint8).tobytes()


def load_split(root: str, split: str, classes: list[str], processes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every photo of `root/split/<class>/` decoded by PIL: uint8 [N, 32, 32, 3] and int64 labels [N]."""
    paths, labels = [], []
    for index, name in enumerate(classes):
        folder = os.path.join(root, split, name)
        files = sorted(f for f in os.listdir(folder) if not f.startswith("."))
        paths += [os.path.join(folder, f) for f in files]
        labels += [index] * len(files)
    with Pool(processes) as pool:
        pixels = pool.map(_decode, paths, chunksize=256)
    side = int(round((len(pixels[0]) // 3) ** 0.5))
    images = np.frombuffer(b"".join(pixels), dtype=np.uint8).reshape(len(paths), side, side, 3)
    return torch.from_numpy(images.copy()), torch.tensor(labels)


def normalized(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 NHWC photos as normalized float32 NCHW on the device."""
    mean = torch.tensor(CIFAR_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD, device=device).view(1, 3, 1, 1)
    return (images.to(device).permute(0, 3, 1, 2).float() / 255 - mean) / std


def augmented(padded: torch.Tensor, pad: int, cutout: int, generator: torch.Generator) -> torch.Tensor:
    """A random crop of the padded photos back to their size, a random horizontal flip and a random cutout square
    (wholly inside the photo, as Page's), all on the device."""
    count, _, height, width = padded.shape
    side = height - 2 * pad
    device = padded.device
    top = torch.randint(0, 2 * pad + 1, (count,), device=device, generator=generator)
    left = torch.randint(0, 2 * pad + 1, (count,), device=device, generator=generator)
    span = torch.arange(side, device=device)
    rows = (top[:, None] + span)[:, None, :, None]
    cols = (left[:, None] + span)[:, None, None, :]
    samples = torch.arange(count, device=device)[:, None, None, None]
    channels = torch.arange(3, device=device)[None, :, None, None]
    crops = padded[samples, channels, rows, cols]
    flip = torch.rand(count, device=device, generator=generator) < 0.5
    crops = torch.where(flip[:, None, None, None], crops.flip(3), crops)
    if cutout:
        y0 = torch.randint(0, side - cutout + 1, (count,), device=device, generator=generator)
        x0 = torch.randint(0, side - cutout + 1, (count,), device=device, generator=generator)
        inside_y = (span[None, :] >= y0[:, None]) & (span[None, :] < y0[:, None] + cutout)
        inside_x = (span[None, :] >= x0[:, None]) & (span[None, :] < x0[:, None] + cutout)
        erase = inside_y[:, None, :, None] & inside_x[:, None, None, :]
        crops = crops.masked_fill(erase, 0.0)
    return crops


def resnet9(num_classes: int) -> nn.Module:
    """Page's ResNet-9 (prep 64, (128, pool, residual pair), (256, pool), (512, pool, residual pair), max-pool, linear
    x 0.125): hydrali's model=resnet9, the same layers as Page's (tests/test_resnet9.py checks it against Keras')."""
    from hydrali.tasks.classification.torch_model import ResNet9

    return ResNet9(num_classes)


def hydrali_resnet18(num_classes: int) -> nn.Module:
    """The ResNet-18 layout `experiment=cifar10` trained until 52df555 (model=small_resnet: two basic blocks a stage,
    64-512 channels, a 3x3 stem)."""
    from hydrali.tasks.classification.torch_model import ResNet

    return ResNet(num_classes, layers=(2, 2, 2, 2), widths=(64, 128, 256, 512), stem="small")


MODELS = {"resnet9": resnet9, "hydrali_resnet18": hydrali_resnet18}


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, flip_average: bool, batch: int) -> float:
    """Top-1 accuracy, optionally of the probabilities averaged over the photo and its mirror."""
    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=images.is_cuda):
        for start in range(0, len(images), batch):
            x = images[start : start + batch].contiguous(memory_format=torch.channels_last)
            probabilities = model(x).float().softmax(1)
            if flip_average:
                probabilities = (probabilities + model(x.flip(3)).float().softmax(1)) / 2
            correct += (probabilities.argmax(1) == labels[start : start + batch]).sum().item()
    model.train()
    return correct / len(images)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_once(args, train_x, train_y, val_x, val_y, seed: int) -> dict:
    """One training run of the recipe; its accuracies and timings."""
    torch.manual_seed(seed)
    generator = torch.Generator(device=train_x.device).manual_seed(seed)
    model = MODELS[args.model](10).to(train_x.device).to(memory_format=torch.channels_last)
    decayed = [p for p in model.parameters() if args.decay == "all" or p.dim() >= 2]
    kept = [p for p in model.parameters() if args.decay == "kernels" and p.dim() < 2]
    groups = [{"params": decayed, "weight_decay": args.weight_decay}, {"params": kept, "weight_decay": 0.0}]
    optimizer = torch.optim.SGD(groups, lr=0.0, momentum=0.9, nesterov=True)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    steps_per_epoch = len(train_x) // args.batch
    total, warmup = steps_per_epoch * args.epochs, steps_per_epoch * args.warmup_epochs
    padded = nn.functional.pad(train_x, (args.pad,) * 4, mode="reflect")
    step, start = 0, None
    for epoch in range(args.epochs):
        if epoch == 1:
            _synchronize(train_x.device)
            start = time.perf_counter()  # the first epoch (cuDNN's autotuning) is left out of the rate
        order = torch.randperm(len(train_x), device=train_x.device, generator=generator)
        for first in range(0, steps_per_epoch * args.batch, args.batch):
            chosen = order[first : first + args.batch]
            x = augmented(padded[chosen], args.pad, args.cutout, generator)
            x = x.contiguous(memory_format=torch.channels_last)
            lr = args.lr * (step / warmup if step < warmup else (total - step) / (total - warmup))
            for group in optimizer.param_groups:
                group["lr"] = lr
            with torch.autocast("cuda", torch.bfloat16, enabled=train_x.is_cuda):
                loss = criterion(model(x), train_y[chosen])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
    _synchronize(train_x.device)
    seconds = time.perf_counter() - start
    return {
        "seed": seed,
        "val_acc": accuracy(model, val_x, val_y, False, 1000),
        "val_acc_flip": accuracy(model, val_x, val_y, True, 1000),
        "images_per_s": steps_per_epoch * args.batch * (args.epochs - 1) / seconds,
        "train_s_estimate": seconds * args.epochs / (args.epochs - 1),
    }


def main() -> None:
    """Decode the folder once, train the recipe `--repeats` times, print one line per run and a table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True, help="a folder with train/<class>/*.jpg and val/<class>/*.jpg")
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet9")
    parser.add_argument("--epochs", type=int, default=24)
    parser.add_argument("--warmup-epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.4, help="the peak learning rate (of the mean loss)")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument(
        "--decay",
        choices=["all", "kernels"],
        default="all",
        help="what weight decay applies to: every parameter "
        "(Page's), or only convolution and dense kernels (hydrali's rule: not biases or normalization parameters)",
    )
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--pad", type=int, default=4)
    parser.add_argument("--cutout", type=int, default=8, help="the erased square's side; 0: none")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda", help="cuda (the figures), or cpu to try the script on a few photos")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs: 2 or more (the first epoch is left out of the rate)")

    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    classes = sorted(d for d in os.listdir(os.path.join(args.root, "train")) if not d.startswith("."))
    started = time.perf_counter()
    train_images, train_y = load_split(args.root, "train", classes, os.cpu_count() or 1)
    val_images, val_y = load_split(args.root, "val", classes, os.cpu_count() or 1)
    print(
        f"decoded {len(train_images)} train and {len(val_images)} val photos with PIL in "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )
    train_x, val_x = normalized(train_images, device), normalized(val_images, device)
    train_y, val_y = train_y.to(device), val_y.to(device)
    runs = []
    for repeat in range(args.repeats):
        run = train_once(args, train_x, train_y, val_x, val_y, args.seed + repeat)
        runs.append(run)
        print(
            f"{args.model} seed {run['seed']}: val/acc {run['val_acc']:.4f}, with flip averaging "
            f"{run['val_acc_flip']:.4f}, {run['images_per_s']:,.0f} images/s, about {run['train_s_estimate']:.1f} s "
            "of training",
            flush=True,
        )
    settings = (
        f"{args.model}, {args.epochs} epochs, lr {args.lr}, batch {args.batch}, label smoothing "
        f"{args.label_smoothing}, cutout {args.cutout}, decay {args.decay}"
    )
    print("| recipe | runs | val/acc (median) | with flip averaging | images/s | training s |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(
        f"| {settings} | {len(runs)} | {statistics.median(r['val_acc'] for r in runs):.4f} "
        f"| {statistics.median(r['val_acc_flip'] for r in runs):.4f} "
        f"| {statistics.median(r['images_per_s'] for r in runs):,.0f} "
        f"| {statistics.median(r['train_s_estimate'] for r in runs):.1f} |"
    )


if __name__ == "__main__":
    main()
