"""On the GPU machine: which step of loading the GPU side takes over signals from Python (the signal handlers a
process has in C, read from /proc/self/status after each step). python3 bench/gpu/signals.py"""

import signal


def caught() -> str:
    """The signals this process catches in C, by name."""
    mask = next(int(line.split()[1], 16) for line in open("/proc/self/status") if line.startswith("SigCgt"))
    return " ".join(signal.Signals(n).name for n in range(1, 32) if mask >> (n - 1) & 1 and n in signal.valid_signals())


def main() -> None:
    """Load torch's CUDA, cuDNN, then build and run DALI's mixed decoder, printing the caught signals after each."""
    signal.signal(signal.SIGUSR1, lambda *a: None)
    print("python handler:", caught())
    import torch

    torch.zeros(1).cuda()
    print("after CUDA:", caught())
    torch.nn.functional.conv2d(torch.zeros(1, 3, 8, 8).cuda(), torch.zeros(4, 3, 3, 3).cuda())
    print("after cuDNN:", caught())
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=2, num_threads=2, device_id=0)
    def pipe():
        data = types.Constant(np.zeros((8, 8, 3), np.uint8), device="cpu")
        return fn.resize(data.gpu(), size=(4, 4))

    p = pipe()
    p.build()
    print("after a DALI GPU pipeline:", caught())
    p.run()
    print("after running it:", caught())
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buf, format="JPEG")

    @pipeline_def(batch_size=1, num_threads=2, device_id=0)
    def decode():
        return fn.decoders.image(types.Constant(np.frombuffer(buf.getvalue(), np.uint8)), device="mixed")

    d = decode()
    d.build()
    d.run()
    print("after DALI's mixed decoder:", caught())


if __name__ == "__main__":
    main()
