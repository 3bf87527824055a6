"""The trainer's watchers: patterns in a run's step metrics that no single step shouts about,
each warned about once, on the progress display and in warnings.txt, with what to change.

    CutWatch          completions cut at rollout.max_new_tokens: a high share for many steps,
                      or a share rising over the run (the policy stops ending its answers)
    SignalWatch       groups whose samples all scored alike (no advantage to learn from): most
                      of them for many steps ("little signal left"), or every advantage 0
    SilentRewards     a reward that scored none of its samples (returns None) for many steps
    FailingTools      every tool call of a step an error, for many steps (a tool's settings,
                      not the policy: the model reads only errors and learns nothing of the tool)
    SampledVsGreedy   the rollouts' metric reward far below what greedy scored before RL

`Watchers` runs the first four on every RL step's metrics (loop.Trainer._metrics, before they
are averaged over ranks); run.py feeds SampledVsGreedy, which needs the greedy score before RL.
A watcher only reads metrics: the parts report facts (Scorer: `adv/all_zero`, rollout_metrics:
`groups/zero_std_frac`, `groups/solved_frac`, `completion/cut_after_answer_frac`), the
watchers judge them.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

from mmrl.config import AlgoConfig

Warn = Callable[[str], None]

# Cut completions: at least CUT_FRAC for CUT_STEPS steps in a row; or the mean share over the
# last CUT_STEPS steps CUT_RISE above the lowest such mean earlier in the run.
CUT_FRAC, CUT_STEPS, CUT_RISE = 0.5, 10, 0.2
# Little signal: the mean share of zero-variance groups over the last SIGNAL_STEPS steps.
SIGNAL_FRAC, SIGNAL_STEPS = 0.7, 20
SILENT_STEPS = 10  # a reward scoring nothing, or every advantage 0, this many steps in a row


class Streak:
    """Steps in a row on which a condition held; `update` is True once, on the step the streak
    reaches `steps`."""

    def __init__(self, steps: int):
        self.steps, self.run, self.fired = steps, 0, False

    def update(self, held: bool) -> bool:
        self.run = self.run + 1 if held else 0
        if self.run >= self.steps and not self.fired:
            self.fired = True
            return True
        return False


class Window:
    """The mean of the last `steps` values, and the lowest full-window mean seen before."""

    def __init__(self, steps: int):
        self.values: deque[float] = deque(maxlen=steps)
        self.lowest = float("inf")

    def add(self, value: float) -> float | None:
        """-> the mean of the last `steps` values, None until there are that many."""
        self.values.append(float(value))
        if len(self.values) < (self.values.maxlen or 0):
            return None
        mean = sum(self.values) / len(self.values)
        self.lowest = min(self.lowest, mean)
        return mean


class CutWatch:
    """Completions cut at `rollout.max_new_tokens`. Either the budget is too short for the
    answers, or the policy has stopped ending them: after `</answer>` it writes on to the limit
    (`<answer>C</answer>C</answer`). GRPO's per-sequence token mean charges a long wrong
    completion less per token, so nothing pulls the length back unless a reward scores the text
    after the answer (`format` does, unless `text_after: true`). On the learning table the
    detection row ran to 97% cut by step 230 under a fixed-share rule; the omni row drifted to
    48% by step 150, under that rule's threshold, hence the trend (docs/runs.md, warnings)."""

    def __init__(self, max_new_tokens: int):
        self.max_new_tokens, self.fired = max_new_tokens, False
        self.high, self.window = Streak(CUT_STEPS), Window(CUT_STEPS)

    def __call__(self, metrics: dict, warn: Warn) -> None:
        cut = metrics.get("completion/truncated_frac")
        if cut is None:
            return
        high = self.high.update(cut >= CUT_FRAC)
        lowest = self.window.lowest  # before this step's window joins it
        mean = self.window.add(cut)
        rising = mean is not None and mean >= CUT_RISE and mean - lowest >= CUT_RISE
        if self.fired or not (high or rising):
            return
        self.fired = True
        what = (f"{cut:.0%} of completions hit rollout.max_new_tokens ({self.max_new_tokens}) "
                f"for {self.high.run} steps in a row" if high else
                f"the share of completions cut at rollout.max_new_tokens ({self.max_new_tokens}) "
                f"rose from {lowest:.0%} to {mean:.0%} (mean of {CUT_STEPS} steps)")
        after = metrics.get("completion/cut_after_answer_frac", 0.0)
        if after >= 0.5 * cut:
            advice = (f"{after:.0%} of completions were cut after a whole answer "
                      f"(completion/cut_after_answer_frac): the policy has stopped ending its "
                      f"answers. Score the text after </answer>: `format` does unless "
                      f"text_after: true (raise its weight if it already does), or add the "
                      f"`overlong` reward")
        else:
            advice = (f"most cut completions hold no whole answer: raise rollout.max_new_tokens "
                      f"(e.g. to {2 * self.max_new_tokens}); if rollouts.jsonl shows answers "
                      f"with text after them, score that text (`format` without text_after)")
        warn(f"{what}. {advice}")


class SignalWatch:
    """Groups whose completions all scored alike give GRPO no advantage. Warns when the mean
    share of such groups that are not solved, over SIGNAL_STEPS steps, reaches SIGNAL_FRAC:
    little signal left (on the learning table, classification seed 3 sat at 73% late in RL and
    rose 0.09); and when every advantage was 0 for SILENT_STEPS steps in a row (`adv/all_zero`)
    while not every group was solved: no update changes the model.

    Solved: every completion scored the best score the run has seen, once the run has seen
    scores differ (`groups/solved_frac` counts groups alike at the step's best; they count when
    that best is the run's). Groups alike because every completion is right are prompts the run
    has learned, not a problem (the quickstart ends so); a run that never saw two scores differ
    (all wrong from the start) has solved nothing."""

    def __init__(self, algo: AlgoConfig):
        self.algo = algo
        self.window, self.little, self.flat = Window(SIGNAL_STEPS), False, Streak(SILENT_STEPS)
        self.best = self.worst = None

    def solved(self, metrics: dict) -> float:
        top, low = metrics.get("reward/total_max"), metrics.get("reward/total_min")
        if top is None or low is None:
            return 0.0
        self.best = top if self.best is None else max(self.best, top)
        self.worst = low if self.worst is None else min(self.worst, low)
        seen_differ, at_best = self.best - self.worst > 1e-6, top >= self.best - 1e-6
        return metrics.get("groups/solved_frac", 0.0) if seen_differ and at_best else 0.0

    def __call__(self, metrics: dict, warn: Warn) -> None:
        solved = self.solved(metrics)
        stuck = bool(metrics.get("adv/all_zero", 0.0)) and solved < 1.0 - 1e-6
        if self.flat.update(stuck):
            warn(f"every advantage was 0 for {self.flat.run} steps in a row, so no step changed "
                 f"the model: {self._flat_hint()}")
            return
        share = metrics.get("groups/zero_std_frac")
        mean = None if share is None else self.window.add(share - solved)
        if mean is None or mean < SIGNAL_FRAC or self.little or self.flat.fired:
            return
        self.little = True
        warn(f"little signal left: in {mean:.0%} of groups every completion scored the same, "
             f"below the best score of the run (groups/zero_std_frac - groups/solved_frac, mean "
             f"of the last {SIGNAL_STEPS} steps), so those groups "
             f"teach nothing. If the held-out metric has stopped rising short of where it "
             f"should be: sample more varied groups (rollout.num_generations, "
             f"rollout.temperature), keep only groups with signal (algo.dynamic_sampling=true), "
             f"or train on harder prompts; if it is where it should be, the run can stop")

    def _flat_hint(self) -> str:
        if self.algo.pos_weight == 0 or self.algo.neg_weight == 0:
            return ("with advantage reinforce (A = r) and pos_weight 0 (NSR), 0/1 rewards leave "
                    "nothing to learn: give wrong answers a negative reward, e.g. accuracy at "
                    "weight 2 with algo.reward_offset=-1 (+-1, as the paper)")
        return ("every group's completions scored alike (all right or all wrong): check the "
                "rewards with `mmrl data inspect FILE --config CONFIG`, or set "
                "algo.dynamic_sampling=true")


class SilentRewards:
    """A reward that scored none of the samples of its tasks (`reward/<key>/scored_frac` 0) for
    SILENT_STEPS steps in a row trains on nothing: it returns None, usually for a missing field."""

    def __init__(self):
        self.streaks: dict[str, Streak] = {}

    def __call__(self, metrics: dict, warn: Warn) -> None:
        for name, frac in metrics.items():
            if not (name.startswith("reward/") and name.endswith("/scored_frac")):
                continue
            key = name[len("reward/"):-len("/scored_frac")]
            streak = self.streaks.setdefault(key, Streak(SILENT_STEPS))
            if streak.update(frac == 0):
                warn(f"reward {key!r} scored none of its samples for {streak.run} steps (it "
                     f"returns None: check the fields it needs with `mmrl data inspect FILE "
                     f"--config CONFIG`)")


class FailingTools:
    """Every call of a step answered with an error (`tools/error_rate` 1 with calls made) for
    SILENT_STEPS steps in a row: usually the run's settings (a tool's result over a guard, a call
    format the warm-up did not teach), named by the most frequent error kind."""

    def __init__(self):
        self.streak = Streak(SILENT_STEPS)

    def __call__(self, metrics: dict, warn: Warn) -> None:
        calls = metrics.get("tools/calls_mean") or 0.0
        if self.streak.update(calls > 0 and metrics.get("tools/error_rate") == 1.0):
            kinds = {k[len("tools/errors/"):]: v for k, v in metrics.items()
                     if k.startswith("tools/errors/") and v}
            kind = max(kinds, key=kinds.get) if kinds else "unknown"
            warn(f"every tool call failed for {self.streak.run} steps (most often {kind}): the "
                 f"model reads only errors; the messages are in rollouts.jsonl (calls[].message) "
                 f"-- check the tools' settings against the data.* guards (docs/tools.md)")


class Watchers:
    """The watchers that read every RL step's metrics."""

    def __init__(self, max_new_tokens: int, algo: AlgoConfig):
        self.parts = [CutWatch(max_new_tokens), SignalWatch(algo), SilentRewards(),
                      FailingTools()]

    def __call__(self, metrics: dict, warn: Warn) -> None:
        for watch in self.parts:
            watch(metrics, warn)


class SampledVsGreedy:
    """Warns once when the rollouts' metric reward sits far below what greedy decoding scored
    before RL (at least `gap` lower and under half of it) over the first `steps` RL steps and
    still over steps 2*steps+1 .. 3*steps. RL optimises the sampled policy; with a fat-tailed
    policy (a small or briefly warmed-up model at temperature 1) the samples are mostly junk,
    and the held-out greedy metric can fall to meet them (docs/learning.md, asr: samples 0.08,
    greedy 0.40 -> 0.15). Samples that start low and catch up are RL working: the quickstart's
    start at 0.29 against greedy 0.70, reach 0.53 by step 30, and greedy ends at 1.00."""

    def __init__(self, metric: str, greedy: float | None, temperature: float, warn: Warn,
                 steps: int = 10, gap: float = 0.15):
        self.metric, self.key = metric, f"reward/{metric}_mean"
        self.greedy, self.temperature, self.warn = greedy, temperature, warn
        self.steps, self.gap, self.seen, self.done = steps, gap, [], False

    def _far(self, values: list[float]) -> bool:
        sampled = sum(values) / len(values)
        return self.greedy - sampled >= self.gap and sampled < 0.5 * self.greedy

    def observe(self, metrics: dict) -> None:
        no_greedy = not isinstance(self.greedy, (int, float)) or self.greedy != self.greedy
        if self.done or no_greedy or self.key not in metrics:  # no eval before RL / resumed
            return
        self.seen.append(float(metrics[self.key]))
        n = self.steps
        if len(self.seen) == n and not self._far(self.seen):
            self.done = True  # close enough from the start
        elif len(self.seen) == 3 * n:
            self.done = True
            early, late = self.seen[:n], self.seen[2 * n:]
            if self._far(late):
                lower = f"lower rollout.temperature (e.g. {min(0.5, self.temperature / 2):g}) or "
                self.warn(f"rollouts at temperature {self.temperature:g} score "
                          f"{sum(early) / n:.2f} on {self.metric} over the first {n} steps and "
                          f"{sum(late) / n:.2f} over steps {2 * n + 1}-{3 * n}, where greedy "
                          f"decoding scored {self.greedy:.2f} before RL: RL learns from the "
                          f"samples, and the greedy metric may fall toward them. If "
                          f"eval/accuracy falls, {lower}warm up longer (sft.steps)")
