"""Run by the distributed tests under torchrun / accelerate launch (or alone): one update on a
fixed global rollout.

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
    from mmrl.train import dist
    from mmrl.train.loop import Trainer

    cfg = config.load(config_path, [f"log.run_dir={os.path.dirname(out_path)}/run",
                                    "log.progress=off", "log.tensorboard=false"])
    trainer = Trainer(cfg)
    b = cfg.rollout.prompts_per_step
    source, learner = trainer.prompts, trainer.learner
    prompts = [source.features(source.dataset[i], i) for i in range(b)]
    torch.manual_seed(1234)
    batch = trainer.rollout.generate(prompts)
    scores, per = trainer.scorer.score(batch)
    world, rank = trainer.info.world, trainer.info.rank
    per_rank = batch.n // world
    rows = list(range(rank * per_rank, (rank + 1) * per_rank))
    grads = {}
    step = learner.optimizer.step

    def capture(*a, **kw):  # the summed, all-reduced gradient the optimizer is about to apply
        grads.update({k: v.grad.clone() for k, v in learner.policy.model.named_parameters()
                      if v.grad is not None})
        return step(*a, **kw)

    strategy_step = learner.strategy.step

    def capture_sharded(model, optimizer):  # ZeRO / FSDP2: gather the reduced gradient shards
        grads.update(full_grads(learner))
        return strategy_step(model, optimizer)

    if learner.strategy.name == "ddp":  # the all-reduce happens inside step: catch the optimizer
        learner.optimizer.step = capture
    else:
        learner.strategy.step = capture_sharded
    local = batch.select(rows)
    needs, budget = [], cfg.train.max_tokens_per_micro_batch
    if budget:  # the micro-batches each rank needs on its own, before the ranks agree on the most
        from mmrl.models.shared_prefix import token_budget_micro_batches
        needs = [None] * world
        mine = len(token_budget_micro_batches(local.prompts, local.completion_mask, budget))
        if trainer.info.enabled:
            torch.distributed.all_gather_object(needs, mine)
        else:
            needs = [mine]
    metrics = trainer.learn(local, scores[rows], {k: [v[i] for i in rows] for k, v in per.items()})
    if os.environ.get("MMRL_WORKER_SAVE") == "1":  # a checkpoint of this state, for consolidation
        trainer.save()
    names = {k for k, _ in learner.policy.model.named_parameters()}
    params = learner.strategy.full_state_dict(learner.policy.model)  # a collective when sharded
    if trainer.info.main:
        torch.save({"params": {k: v.detach().cpu() for k, v in params.items() if k in names},
                    "grads": grads, "metrics": metrics, "strategy": learner.strategy.name, "needs": needs},
                   out_path)
    # Every rank leaves the group before exiting: a gloo group left to interpreter shutdown can
    # abort the process (SIGABRT, "terminate called without an active exception").
    dist.barrier(trainer.info)
    dist.destroy(trainer.info)


def full_grads(learner) -> dict:
    """{name: whole gradient} on every rank; a collective (called on all ranks)."""
    out = {}
    for name, p in learner.policy.model.named_parameters():
        if learner.strategy.name == "deepspeed":
            from deepspeed.utils import safe_get_full_grad
            g = safe_get_full_grad(p)
        else:
            g = p.grad.full_tensor() if p.grad is not None else None
        if g is not None:
            out[name] = g.detach().cpu().clone()
    return out


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
