"""The one DP-SGD settings object: privacy target, clipping, norm estimation, randomness and loss release.

:class:`DPSGDSettings` holds every setting DP-SGD itself reads, with one name and one default each,
validated once. ``privlm train`` (:class:`privlm.training.loop.TrainConfig`), the Hugging Face trainer
(:class:`privlm.training.trainer.PrivacyArguments`) and the audit
(:class:`privlm.audit.training.RunSettings`) extend it with what only they need; DP
fine-tune-then-generate builds a ``TrainConfig``. Each builds its :class:`PrivacyEngine` and private
model through :meth:`DPSGDSettings.privacy_engine` and :meth:`DPSGDSettings.make_private`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from torch import nn
from torch.utils.data import DataLoader

from privlm.dpsgd.clipping import LossFn
from privlm.dpsgd.engine import PrivacyEngine, PrivateModel
from privlm.dpsgd.loss_release import LossRelease
from privlm.dpsgd.optimizer import DPOptimizer
from privlm.errors import UserError
from privlm.norm_modes import check_probes, norm_mode
from privlm.privacy.accountant import Method
from privlm.privacy.validation import check_delta, check_epsilon
from privlm.randomness import RunStreams

ACCOUNTANTS = ("pld", "rdp")


@dataclass(frozen=True, kw_only=True)
class DPSGDSettings:
    """DP-SGD settings shared by every private training path.

    ``epsilon``: the target ε (σ calibrated for the planned steps) — or give ``noise_multiplier`` σ
    (with ``epsilon`` too, training stops when the budget is spent; σ = 0 clips without noise, NOT private,
    an ablation: :attr:`clip_only`); ``delta`` δ. ``max_grad_norm`` C:
    the per-example clipping norm. ``norm_mode``/``probes``: how per-example norms are computed
    (:mod:`privlm.norm_modes`); randomized modes are accounted with their envelope.
    ``bookkeeping``: clipped sums from the per-layer factors (no second backward pass).
    ``accountant``: ``"pld"`` or ``"rdp"``. ``physical_batch_size``: micro-batch cap (memory only).
    ``seed``: reproducible sampling, probes and noise — whoever knows it can remove the noise, so a
    seeded run is *not* a private release; ``None`` draws independent keys from the OS
    (:mod:`privlm.randomness`). ``loss_bound`` L and ``loss_noise_fraction`` α: the DP loss release
    (:class:`~privlm.dpsgd.loss_release.LossRelease`; α = 0 switches it off; the defaults L = 10 nats
    and α = 0.2 cost σ a factor √1.04 ≈ 1.02 in the accounting).

    Raises :class:`UserError` on construction for any invalid value, naming it as :meth:`option`
    spells it."""

    epsilon: float | None = None
    delta: float = 1e-5
    noise_multiplier: float | None = None
    max_grad_norm: float = 1.0
    norm_mode: str = "mixed"
    probes: int = 32
    bookkeeping: bool = True
    accountant: str = "pld"
    physical_batch_size: int | None = None
    seed: int | None = None
    loss_bound: float = 10.0
    loss_noise_fraction: float = 0.2

    OPTION_NAMES: ClassVar[dict[str, str]] = {}
    """How a subclass's users spell a field in messages (e.g. ``{"epsilon": "--epsilon"}``)."""

    def __post_init__(self) -> None:
        self.check_dpsgd()

    @classmethod
    def option(cls, name: str) -> str:
        """The field ``name`` as this settings object's users spell it in messages."""
        return cls.OPTION_NAMES.get(name, name)

    @property
    def is_private(self) -> bool:
        """Whether these settings train privately (subclasses may offer a non-private baseline)."""
        return True

    @property
    def clip_only(self) -> bool:
        """σ = 0: per-example clipping without noise — NOT differentially private (ε = ∞), an ablation that
        separates what clipping costs from what the noise costs."""
        return self.is_private and self.noise_multiplier == 0

    @property
    def differentially_private(self) -> bool:
        """Whether the run's steps are a DP release, accounted by the ledger: private and with noise (not
        :attr:`clip_only`). What every output calls private (summary, log keys, progress) follows this."""
        return self.is_private and not self.clip_only

    def check_dpsgd(self) -> None:
        """Validate the DP-SGD fields (the privacy ones only when :attr:`is_private`). Raises :class:`UserError`."""
        norm_mode(self.norm_mode, self.option("norm_mode"))
        check_probes(self.norm_mode, self.probes, self.option("probes"))
        if self.physical_batch_size is not None and not (
            isinstance(self.physical_batch_size, int) and self.physical_batch_size >= 1
        ):
            raise UserError(
                f"{self.option('physical_batch_size')} must be an integer >= 1, got {self.physical_batch_size!r}"
            )
        if not self.is_private:
            return
        if self.epsilon is None and self.noise_multiplier is None:
            raise UserError(f"a private run needs {self.option('epsilon')} (or a noise multiplier)")
        if self.epsilon is not None:
            check_epsilon(self.epsilon, self.option("epsilon"))
        check_delta(self.delta, self.option("delta"))
        if self.noise_multiplier is not None and not self.noise_multiplier >= 0:
            raise UserError(f"{self.option('noise_multiplier')} must be >= 0, got {self.noise_multiplier}")
        if self.clip_only and self.epsilon is not None:
            raise UserError(
                f"{self.option('noise_multiplier')} 0 clips without noise, which is NOT private: it meets no "
                f"{self.option('epsilon')}; drop {self.option('epsilon')} (an ablation) or give σ > 0"
            )
        if not self.max_grad_norm > 0:
            raise UserError(f"{self.option('max_grad_norm')} must be > 0, got {self.max_grad_norm!r}")
        if self.accountant not in ACCOUNTANTS:
            raise UserError(
                f"{self.option('accountant')} must be one of {', '.join(ACCOUNTANTS)}, got {self.accountant!r}"
            )
        if not self.loss_noise_fraction >= 0:
            raise UserError(
                f"{self.option('loss_noise_fraction')} must be >= 0 (0: no DP loss), got {self.loss_noise_fraction}"
            )
        self.loss_release()  # validates the bound

    def loss_release(self) -> LossRelease | None:
        """The DP loss release (None when switched off or not private)."""
        return LossRelease.optional(self.loss_bound, self.loss_noise_fraction) if self.is_private else None

    def privacy_engine(self, streams: RunStreams | None = None) -> PrivacyEngine:
        """A fresh engine for these settings; ``streams`` (e.g. rank 0's, broadcast) or keys from ``seed``."""
        accountant = cast(Method, self.accountant)  # validated on construction
        if streams is not None:
            return PrivacyEngine(self.norm_mode, self.probes, self.bookkeeping, accountant, streams=streams)
        return PrivacyEngine(self.norm_mode, self.probes, self.bookkeeping, accountant, seed=self.seed)

    def make_private(
        self,
        engine: PrivacyEngine,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        loader: DataLoader[Any],
        *,
        epochs: float,
        loss_fn: LossFn | None = None,
        **options: Any,
    ) -> tuple[PrivateModel, DPOptimizer, DataLoader[Any]]:
        """``engine.make_private`` with these settings: σ as given, else calibrated to ``epsilon`` over
        ``epochs``; ``options`` pass through (e.g. ``loss_reduction``)."""
        return engine.make_private(
            module,
            optimizer,
            loader,
            max_grad_norm=self.max_grad_norm,
            noise_multiplier=self.noise_multiplier,
            target_epsilon=None if self.noise_multiplier is not None else self.epsilon,
            delta=self.delta,
            epochs=epochs,
            max_physical_batch_size=self.physical_batch_size,
            loss_fn=loss_fn,
            loss_release=self.loss_release(),
            **options,
        )
