"""A trainer rank for tests/trainer/test_distributed.py: `[torchrun ...] python -m tests.trainer.dist_worker RUN_DIR
MODEL OUT [--resume]` runs the real `Trainer` on the run's batches, then writes the gradients of its last step
(gathered whole under FSDP) to OUT from rank 0."""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import torch

    from prime_lab.runs.registry import Run
    from prime_lab.trainer.runtime import load_config
    from prime_lab.trainer.train import Trainer

    run_dir, model, out = (Path(a) for a in argv[:3])
    run = Run(run_dir)
    trainer = Trainer(run, load_config(run), model, resume="--resume" in argv)
    dist = trainer.dist
    # train() ends the process group: keep it open for the gradient gather below
    close, dist.close = dist.close, lambda: None  # type: ignore[method-assign]
    code = trainer.train()
    grads = {}
    for name, param in trainer.model.named_parameters():
        if param.grad is not None:
            grad = param.grad
            grads[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().cpu().clone()
    if dist.is_main:
        torch.save(grads, out)
    close()
    return code


if __name__ == "__main__":
    from prime_lab.trainer.distributed import exit_rank

    exit_rank(main(sys.argv[1:]))
