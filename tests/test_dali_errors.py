"""DALI failures while training become one line: DALI's words without C++ frames; only a decoder's run-time
failure looks for the file."""

import pytest

from hydrali.core.data.dali_errors import dali_reason, explain_dali_error, is_decode_failure
from tests.support.settings import optim_settings

DECODE = (
    "Critical error in pipeline:\nError in CPU operator `nvidia.dali.fn.decoders.image`,\nwhich was used in the "
    'pipeline definition with the following traceback:\n\n  File "recipes.py", line 12, in p\n\nencountered:'
    "\n\nnvImageCodec failure: '#3'\nCurrent pipeline object is no longer valid."
)
OOM = (
    "Critical error in pipeline:\nError in MIXED operator `nvidia.dali.fn.decoders.image_random_crop`,\nwhich was "
    "used in the pipeline definition with the following traceback:\n\nencountered:\n\nCUDA allocation failed\n"
    "Stacktrace (3 entries):\n[frame 0]: /usr/lib/libdali.so(+0x1a2b3c) [0x7f00]\n[frame 1]: /usr/lib/libdali.so"
)


def test_a_decoder_failure_names_the_file_found():
    assert is_decode_failure(DECODE)
    err = explain_dali_error(RuntimeError(DECODE), lambda: "cannot decode /data/x.jpg: broken")
    assert str(err) == "cannot decode /data/x.jpg: broken"


def test_a_memory_failure_is_not_a_file_search_and_says_what_to_change():
    searched = []
    err = explain_dali_error(RuntimeError(OOM), lambda: searched.append(1))
    assert not searched, "no dataset scan for a memory failure"
    assert str(err).startswith("DALI's nvidia.dali.fn.decoders.image_random_crop failed: CUDA allocation failed")
    assert "frame" not in str(err) and "libdali" not in str(err)
    assert "lower data.batch_size" in str(err)
    assert dali_reason(OOM) == "CUDA allocation failed"


def test_a_real_dali_failure_is_dalis_words_without_its_cpp_source_line():
    """A pipeline that fails at run time in DALI itself (a slice out of bounds): the line holds DALI's reason and the
    operator, not the `C++ context:` DALI appends (a source path, or nothing)."""
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def out_of_bounds():
        values = fn.random.uniform(range=[-1, 1], shape=(2, 3))
        return fn.slice(values, 5, 2, axes=[0], out_of_bounds_policy="error")

    pipe = out_of_bounds()
    pipe.build()
    with pytest.raises(RuntimeError) as caught:
        pipe.run()
    raised = caught.value
    assert "C++ context:" in str(raised), "DALI's message as this test knows it"
    line = str(explain_dali_error(raised, lambda: None))
    assert line.startswith("DALI's nvidia.dali.fn.slice failed: Slice can't be placed out of bounds"), line
    assert "C++" not in line and "\n" not in line, line


def test_a_lightning_validation_batch_of_padding_only_is_skipped():
    import torch

    from hydrali.backends.lightning.module import HydraliModule
    from hydrali.core.distributed.topology import detect_topology
    from hydrali.core.run.plan import make_plan
    from hydrali.tasks.classification.torch_task import TorchClassification

    plan = make_plan(
        topology=detect_topology(1, 1, env={}),
        batch_size=4,
        base_lr=0.1,
        ref_batch=4,
        rule="none",
        warmup_epochs=0,
        epochs=1,
        seed=0,
        device="cpu",
    )
    task = TorchClassification(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3)), 3)
    module = HydraliModule(task, optim_settings(), plan, 1)
    scored = []
    task.validation_step = scored.append
    empty = {"images": torch.zeros(0, 3, 2, 2), "labels": torch.zeros(0, 1, dtype=torch.int32)}
    assert module.validation_step(empty, 0) is None
    assert scored == [], "an empty batch is neither scored nor logged"
