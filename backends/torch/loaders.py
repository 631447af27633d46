"""DALI's PyTorch plugin as a torch training loop's loaders: one endless iterator per split of this process's shard,
cut into epochs by hydrali.core.run.epoch, and the training loader that saves and restores DALI's reader state."""

from __future__ import annotations

from nvidia.dali.plugin.pytorch import DALIGenericIterator

from hydrali.core.contracts.run import RunContract
from hydrali.core.data.dali_errors import explain_dali_error
from hydrali.core.run.epoch import EpochSteps

LAYOUT = "CHW"  # the image layout torch takes (also what core.data.autotune probes with)


class DaliLoader:
    """An endless DALIGenericIterator as a torch training loop (Lightning's among them) wants a loader: len() and
    iter() give one epoch of the contract. Validation batches are trimmed to their real samples (the shard's padding
    is dropped), and a validation that stopped early is finished first, so that every validation starts at its
    shard's start."""

    def __init__(self, make_iterator, steps: int, on_error, valid=None):
        self.make_iterator = make_iterator  # make_iterator(restore) -> a DALIGenericIterator (restore: DALI state)
        self.iterator = make_iterator(None)
        self.steps = steps
        self.on_error = on_error
        self.valid = valid  # valid(step) -> real samples in batch `step`; None: all (training)
        self._position = 0  # batches taken in the current epoch

    def __len__(self) -> int:
        return self.steps

    def _next(self) -> dict:
        try:
            return next(self.iterator)[0]
        except RuntimeError as err:
            raise self.on_error(err) from err

    def __iter__(self):
        if self.valid is not None:
            while self._position % self.steps:  # an interrupted validation: skip to the shard's start
                self._next()
                self._position += 1
        self._position = 0
        for step in range(self.steps):
            batch = self._next()
            self._position = step + 1
            if self.valid is not None:
                keep = self.valid(step)
                batch = {k: v[:keep] for k, v in batch.items()}
            yield batch


class ResumableDaliLoader(DaliLoader):
    """The training loader of a pipeline built with DALI's checkpointing: its `position` (DALI's reader and random
    state after the batches of the epoch trained so far) goes into every checkpoint, and `restore` continues from
    one, mid-epoch included, so that the batches after a resume are those an uninterrupted run reads (on the
    Lightning backend, backends/lightning/callbacks.py's ReaderPosition carries it).

    Lightning fetches a batch ahead of the one it trains, so the loader keeps DALI's state before each batch it
    hands out and gives the one after the batches trained (`trained`, which the backend sets after each training
    step: ReaderPosition on Lightning)."""

    def __init__(self, make_iterator, steps: int, on_error):
        super().__init__(make_iterator, steps, on_error)
        self.trained = 0  # batches of the current epoch trained (set after each training step)
        self._start = 0  # the epoch's batch the next iter() starts at (after a mid-epoch restore)
        self._states: dict[int, str] = {}  # DALI's state before batch i of the epoch (i = steps: after the last)

    def _state(self) -> str:
        return self.iterator.checkpoints()[0]

    def __iter__(self):
        start, self._start = self._start, 0
        self.trained, self._states = start, {}
        for step in range(start, self.steps):
            self._states.pop(step - 3, None)  # Lightning trains at most one batch behind the one it fetched
            self._states[step] = self._state()
            yield self._next()
        self._states[self.steps] = self._state()

    def position(self, epoch_done: bool) -> dict:
        """DALI's state after the batches of the epoch trained so far, their count, and whether the epoch ended
        there (the next iteration then starts a new epoch)."""
        state = self._states.get(self.trained)
        return {"reader": state if state is not None else self._state(), "trained": self.trained, "done": epoch_done}

    def restore(self, position: dict) -> None:
        """Continue from a `position`: the pipeline is built again from its state, and the next iteration starts
        at the batch after those trained, or at a new epoch when that epoch had ended."""
        del self.iterator  # one pipeline at a time (on a GPU, its memory)
        self.iterator = self.make_iterator(position["reader"])
        self.trained = int(position["trained"])
        self._start = 0 if position["done"] else self.trained


def dali_loader(*, task, contract: RunContract, dataset, is_training: bool) -> DaliLoader:
    """The loader of one split of this process's shard: the task's DALI pipeline through DALIGenericIterator, cut
    into epochs by the plan's epoch steps; DALI's errors are explained (hydrali.core.data.dali_errors). With
    pipeline.checkpointing, the training loader saves and restores DALI's state with the backend's checkpoints
    (ResumableDaliLoader)."""
    plan = contract.plan
    epoch: EpochSteps = plan.epoch
    shard = plan.shard
    checkpointing = is_training and contract.reader_checkpointing

    def explain(err: RuntimeError) -> Exception:
        return explain_dali_error(err, lambda: task.explain_decode_error(dataset))

    def make_iterator(restore: str | None) -> DALIGenericIterator:
        pipe = contract.pipeline(
            task, dataset, shard, LAYOUT, is_training, checkpointing=checkpointing, restore=restore
        )
        try:
            pipe.build()
            # endless: the contract counts the steps
            return DALIGenericIterator([pipe], list(task.output_names(is_training)))
        except RuntimeError as err:
            raise explain(err) from err

    if checkpointing:
        return ResumableDaliLoader(make_iterator, epoch.train_steps, explain)
    if is_training:
        return DaliLoader(make_iterator, epoch.train_steps, explain)
    return DaliLoader(make_iterator, epoch.val_steps, explain, valid=lambda step: epoch.val_valid(shard.shard_id, step))
