"""OPSD (Zhao et al., arXiv 2601.18734; code siyan-zhao/OPSD) and GRPO+OPSD, on our records.

- `grpo_opsd`: L = PPO-clip(A_GRPO) + η·k3 + λ·tm[ℓ], ℓ the divergence of method.distill_divergence
  (full-vocabulary D_β by default) between the student and the privileged teacher;
- `opsd`: the same term replaces the PG loss (pg_loss_coef 0, as SDAR's OPSD baseline and SDPO's
  `loss_mode: sdpo`); the k3 KL to the reference stays.

The ORSD paper's OPSD and GRPO+OPSD rows come from SDAR's protocol, where both use SDAR's gated
sampled-token loss (distill_divergence=sdar, gate β_g = method.sdar_gate_beta): "OPSD" is `opsd`
with it (no PG term, β_g = 5), "GRPO+OPSD" is `grpo_opsd` with it and β_g = 0 (g ≡ 0.5, which is
`sdar` with β_g = 0); the presets configs/*_sdar_opsd.yaml and *_sdar_grpo_opsd.yaml set them.

With the default privileged context (the selected rubric B*) this is "rubric-OPSD": OPSD's teacher
saw a reference solution, SDAR's retrieved skills; see docs/methods.md.
"""

from __future__ import annotations

from .distill import Distillation, SelfDistillation


class GRPOOPSD(SelfDistillation):
    name = "grpo_opsd"
    pg_coef = 1.0

    def __init__(self, config) -> None:
        super().__init__(config)
        m = config.method
        self.distillation = Distillation(divergence=m.distill_divergence, coef=m.distill_coef, pg_coef=self.pg_coef,
                                         teacher=m.distill_teacher, beta=m.distill_beta, top_k=m.distill_topk,
                                         tail=m.distill_topk_tail, gate_beta=m.sdar_gate_beta)


class OPSD(GRPOOPSD):
    name = "opsd"
    pg_coef = 0.0
