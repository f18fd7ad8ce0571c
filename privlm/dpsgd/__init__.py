"""DP-SGD for Hugging Face causal LMs with per-sample norms in five modes (exact, ghost, mixed,
Hutchinson, Hutch++), clipping by book-keeping or a second backward, Poisson sampling and accounting.

    from privlm.dpsgd import PrivacyEngine
    engine = PrivacyEngine(norm_mode="hutchinson", probes=32)
    model, optimizer, loader = engine.make_private(model, optimizer, loader,
                                                   noise_multiplier=1.0, max_grad_norm=1.0)
"""

from privlm.dpsgd.clipping import ClipStats, PerSampleClipper, clip_factors
from privlm.dpsgd.engine import PrivacyEngine, PrivateModel
from privlm.dpsgd.loss_release import LossRelease
from privlm.dpsgd.losses import causal_lm_losses, token_losses
from privlm.dpsgd.norms import NORM_MODES
from privlm.dpsgd.optimizer import DPOptimizer
from privlm.dpsgd.sampling import PoissonBatchSampler, physical_batches, poisson_loader

__all__ = [
    "NORM_MODES",
    "ClipStats",
    "DPOptimizer",
    "LossRelease",
    "PerSampleClipper",
    "PoissonBatchSampler",
    "PrivacyEngine",
    "PrivateModel",
    "causal_lm_losses",
    "clip_factors",
    "physical_batches",
    "poisson_loader",
    "token_losses",
]
