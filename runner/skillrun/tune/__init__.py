"""Tuning and ablation: the seeds' method (sweep from the nearest recipe, ablate a lever, re-check a
winner against the incumbent) as runner stages.

    tune_shape                    (sweep.py)   -> tuning artifact + proposed SKILL.md diff
    ablate_shape                  (ablate.py)  -> ablation artifact: load-bearing or not, vs the card's claim
    prune_shape                   (prune.py)   -> FlyDSL space pruned on a CPU by the static gates

What the three share (context, start recipe, base record, candidate rows): task.py. Artifacts:
schemas/tuning.schema.json, written under validation/_tuning/<card>/ (skillrun.evidence.tuning_artifact).
Every UNTUNED item of a trace's plan: skillrun.api.tune_from_plan.
Workers: workers.py (inline, one local worker per visible GPU, or Ray); lane.py is the worker.
"""
