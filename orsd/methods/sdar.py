"""SDAR (Lu et al. 2026, arXiv 2605.15155; code copy asayu255/SDAR, sdar_utils.py).

L = PPO-clip(A_GRPO) + η·k3 + λ·tm[g_t·(sg[log q(y_t)] − log π_θ(y_t))], g_t = sg[σ(β_g·δ_t)],
δ_t = sg[log q(y_t)] − sg[log π_θ(y_t)]. Every sampled token is pushed up with weight λ·g ∈ (0, λ):
near λ where the teacher likes it more than the student, near 0 where it rejects it.

δ uses the live log π_θ of the update's forward, as SDAR's code does. Our update takes one optimizer
step per batch (gradient accumulation over micro-batches), so the live log-prob equals π_old's up to
numerics and the choice only matters if PPO epochs are ever added. The teacher is π_old with the
privileged context (SDAR: retrieved skills; here B* or a successful sibling, see docs/methods.md).
With sdar_gate_beta = 0, g ≡ 0.5: the teacher-independent "GRPO+OPSD" of SDAR's scripts.
"""

from __future__ import annotations

from .distill import Distillation, SelfDistillation


class SDAR(SelfDistillation):
    name = "sdar"

    def __init__(self, config) -> None:
        super().__init__(config)
        m = config.method
        self.distillation = Distillation(divergence="sdar", coef=m.distill_coef, pg_coef=1.0,
                                         teacher=m.distill_teacher, gate_beta=m.sdar_gate_beta)
