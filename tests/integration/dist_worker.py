"""Run by test_distributed.py under torchrun (or alone): one update on a fixed global rollout.

Every rank builds the same global rollout (same model, same seed), keeps its contiguous slice of
groups, and calls the trainer's real `learn` stage (global advantages, global normaliser,
all-reduced gradients). The updated parameters are saved for the test to compare with a
single-process update on the whole batch.
"""
import os
import sys


def main(config_path: str, out_path: str) -> None:
    import torch

    from mmrl import config
    from mmrl.train.loop import Trainer

    cfg = config.load(config_path, [f"log.run_dir={os.path.dirname(out_path)}/run",
                                    "log.progress=off", "log.tensorboard=false"])
    trainer = Trainer(cfg)
    b = cfg.rollout.prompts_per_step
    prompts = [trainer.features(trainer.train_set[i], i) for i in range(b)]
    torch.manual_seed(1234)
    batch = trainer.rollout(prompts)
    scores, per = trainer.score(batch)
    world, rank = trainer.dist.world, trainer.dist.rank
    per_rank = batch.n // world
    rows = list(range(rank * per_rank, (rank + 1) * per_rank))
    grads = {}
    step = trainer.optimizer.step

    def capture(*a, **kw):  # the summed, all-reduced gradient the optimizer is about to apply
        grads.update({k: v.grad.clone() for k, v in trainer.model.named_parameters()
                      if v.grad is not None})
        return step(*a, **kw)

    trainer.optimizer.step = capture
    metrics = trainer.learn(batch.select(rows), scores[rows], {k: [v[i] for i in rows]
                                                               for k, v in per.items()})
    if trainer.dist.main:
        torch.save({"params": {k: v.detach() for k, v in trainer.model.named_parameters()},
                    "grads": grads, "metrics": metrics}, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
