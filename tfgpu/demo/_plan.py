"""The demo's pure decisions: how big it runs, and how long `tfgpu.tune` may take."""

from __future__ import annotations

import dataclasses

SEED = 0
NUM_CLASSES = 10
LEARNING_RATE = 2e-3


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big the demo runs. Chosen by `choose_sizes` from the hardware."""

    num_train: int  # examples per epoch (a multiple of the largest global batch)
    num_test: int
    stored_size: int  # side of the stored JPEGs
    image_size: int  # side of the model input (random crop of the resized image)
    per_replica_batch: int
    width: int  # filters of the first conv layer (then 2x, 4x); a multiple of 8
    epochs: int
    diagnose_steps: int
    diagnose_warmup: int
    check_xla: bool
    tune_budget_s: float  # tfgpu.tune's time budget on the tfgpu side

    @property
    def resize_to(self) -> int:
        """Side the decoded image is resized to, before the random crop (+12.5%)."""
        return self.image_size + self.image_size // 8


def choose_sizes(*, quick: bool, num_gpus: int, epochs: int | None = None) -> Sizes:
    """The demo's sizes for the hardware (pure): tiny with `quick`, else by `num_gpus`;
    `num_train` is a multiple of the global batch on up to 8 replicas."""
    # On the CPU: under a minute per side on 2 cores (8 epochs of 128 steps). The images are
    # stored larger than the model input (as in most datasets) and the model is small next to
    # their decoding, as a GPU's step is short next to a CPU input pipeline.
    sizes = Sizes(
        num_train=8192,
        num_test=1024,
        stored_size=128,
        image_size=32,
        per_replica_batch=64,
        width=8,
        epochs=8,
        diagnose_steps=20,
        diagnose_warmup=3,
        check_xla=True,
        tune_budget_s=90.0,
    )
    if quick:
        sizes = Sizes(
            num_train=512,
            num_test=256,
            stored_size=48,
            image_size=24,
            per_replica_batch=32,
            width=8,
            epochs=2,
            diagnose_steps=3,
            diagnose_warmup=1,
            check_xla=False,
            tune_budget_s=20.0,
        )
    elif num_gpus > 0:
        batch = 256
        steps = 80  # per epoch, on all GPUs together
        sizes = dataclasses.replace(
            sizes,
            num_train=steps * batch * min(num_gpus, 8),
            num_test=4096,
            image_size=96,
            per_replica_batch=batch,
            width=32,
            epochs=5,
        )
    if epochs is not None:
        sizes = dataclasses.replace(sizes, epochs=epochs)
    return sizes
