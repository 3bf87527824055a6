"""`mmrl plan`: what a run needs before it runs, apart from the benchmarks (mmrl/bench measures;
this package predicts). The memory model and its time floor, read from a run config:

    memory.py       the per-process peak: weights, gradients, optimizer, reference, and per
                    phase the working set (Facts x Workload x Cluster -> Prediction)
    probe.py        activation bytes per token of each block, counted by autograd on meta
    from_config.py  a RunConfig -> Facts and the per-process Workload
    timing.py        a roofline floor per phase from the same Facts and Workload
    fit.py          `mmrl train`'s memory check (train.memory_check) and the fixes it proposes
    report.py       the `mmrl plan` command, and the recipe READMEs' fit sections

    from mmrl import plan
    f, _ = plan.config_facts(cfg)
    w, _ = plan.config_workload(cfg, f, world=8)
    plan.predict(f, w, plan.Cluster(80, 8, "zero2")).peak
"""
from mmrl.plan.from_config import TEXT_TOKENS, config_facts, config_workload, media_budget
from mmrl.plan.memory import (GIB, STRATEGIES, Cluster, Facts, Prediction, Workload,
                              activation_terms, facts, gradient_terms, largest_group,
                              largest_micro_batch, model_facts, predict, rollout_terms,
                              static_terms)

__all__ = ["GIB", "STRATEGIES", "TEXT_TOKENS", "Cluster", "Facts", "Prediction", "Workload",
           "activation_terms", "config_facts", "config_workload", "facts", "gradient_terms",
           "largest_group", "largest_micro_batch", "media_budget", "model_facts", "predict",
           "rollout_terms", "static_terms"]
