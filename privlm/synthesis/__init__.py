"""Every way privlm makes a training set, one subpackage per method, in one registry.

Each subpackage's ``__init__`` registers its method(s) with :mod:`privlm.synthesis.registry` (cheap
imports only; the work runs from its ``method`` module): ``gradmm`` (GRADMM),
``pe`` (Private Evolution), ``dp_finetune`` (DP fine-tune, then generate), ``generation`` (zero-shot and
few-shot), ``coresets`` (random, herding, k-center real subsets) and ``full_pool``. ``privlm synth
--method``, the experiment's ``[methods.*]`` tables and the README's method table read the registry.
"""
