"""Role workers: plain classes, one per role, each holding its model and nothing else.

``PolicyWorker`` (the actor), ``CriticWorker``, ``ReferenceWorker``, ``RewardWorker``
and ``RolloutWorker`` offer a few coarse methods over ``rlx.batch.Batch``: log-probs,
values, a training pass, scores, generation, weights, save and load. They import no Ray;
a launcher (``rlx.launch``) places them in this process or elsewhere and calls them.
"""
