"""The demo's pure decisions: how big it runs, and how long `tfgpu.tune` may take."""

from __future__ import annotations

import dataclasses

SEED = 0
NUM_CLASSES = 10
LEARNING_RATE = 2e-3


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big the demo runs, chosen by `choose_sizes` from the hardware; the defaults are the
    CPU's (why these: docs/demo.md, section "Data and sizes")."""

    num_train: int = 8192  # examples per epoch (a multiple of the largest global batch)
    num_test: int = 1024
    stored_size: int = 128  # side of the stored JPEGs
    image_size: int = 32  # side of the model input (random crop of the resized image)
    per_replica_batch: int = 64
    width: int = 8  # filters of the first conv layer (then 2x, 4x); a multiple of 8
    epochs: int = 8
    diagnose_steps: int = 20
    diagnose_warmup: int = 3
    check_xla: bool = True
    tune_budget_s: float = 90.0  # tfgpu.tune's time budget on the tfgpu side

    @property
    def resize_to(self) -> int:
        """Side the decoded image is resized to, before the random crop (+12.5%)."""
        return self.image_size + self.image_size // 8


def choose_sizes(*, quick: bool, num_gpus: int, epochs: int | None = None) -> Sizes:
    """The demo's sizes for the hardware (pure): tiny with `quick`, else by `num_gpus`;
    `num_train` is a multiple of the global batch on up to 8 replicas."""
    sizes = Sizes()
    if quick:
        sizes = Sizes(
            num_train=512, num_test=256, stored_size=48, image_size=24, per_replica_batch=32,
            epochs=2, diagnose_steps=3, diagnose_warmup=1, check_xla=False, tune_budget_s=10.0,
        )  # fmt: skip
    elif num_gpus > 0:
        batch = 256
        steps = 80  # per epoch, on all GPUs together
        sizes = Sizes(
            num_train=steps * batch * min(num_gpus, 8), num_test=4096, image_size=96,
            per_replica_batch=batch, width=32, epochs=5,
        )  # fmt: skip
    if epochs is not None:
        sizes = dataclasses.replace(sizes, epochs=epochs)
    return sizes
