"""Training steps of a tiny model with a fully scripted engine, for the distributed-equality test.

Run as `python dist_worker.py MODEL_DIR OUT STEPS ZERO_STAGE` (one process, no DeepSpeed) or under
`torchrun --nproc_per_node 2` (DeepSpeed ZeRO-<stage>, gloo). Rank 0 saves the final weights and
every step's metrics to OUT.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))

import torch  # noqa: E402

from orsd.train import distributed, lora  # noqa: E402
from orsd.train.model import frozen_copy, load_policy, load_tokenizer  # noqa: E402
from orsd.train.build import make_env  # noqa: E402
from orsd.train.trainer import Trainer  # noqa: E402
from orsd.train.build import build_verifier, freeze_for_update  # noqa: E402
from scripted import ScriptedEngine, small_config  # noqa: E402


def main(model_dir: str, out: str, steps: int, zero_stage: int, *overrides: str) -> None:
    torch.set_num_threads(1)
    # rollout.engine=vllm only satisfies the guard against hf generation from ZeRO-3 shards: the engine
    # used is the fully scripted test fake, whose teacher-forced forwards are the same count on every rank
    # (and vLLM's rules apply: no n-gram ban on bundles)
    config = small_config(f"model.path={model_dir}", "method.name=orsd", f"distributed.zero_stage={zero_stage}",
                          "rollout.engine=vllm", "rubric.no_repeat_ngram_size=0", "rubric.draft_tokens=0",
                          "optim.lr=1e-2", "model.device=cpu", "optim.micro_batch_tokens=1", *overrides)
    dist = distributed.setup(config)
    tokenizer = load_tokenizer(model_dir)
    policy = load_policy(model_dir, device="cpu")
    if config.model.lora.rank:  # as build.adapt: the base view, then peft's adapters
        reference = lora.base_view(policy)
        torch.manual_seed(0)
        lora.inject(policy, config.model.lora, config.optim.train_layers)
    else:
        reference = frozen_copy(policy)
    freeze_for_update(policy, config, "", distributed=dist is not None, log=lambda *_: None)  # as build() does
    verifier = build_verifier(config, reference, tokenizer)
    engine = ScriptedEngine(policy, tokenizer, fully_scripted=True)
    trainer = Trainer(config, policy, tokenizer, reference, verifier, make_env(config), engine=engine, dist=dist,
                      ds_engine=distributed.wrap(policy, config) if dist else None)
    metrics = [trainer.step().metrics for _ in range(steps)]
    with distributed.gathered(*trainer.policy.parameters()):  # ZeRO-3: full values on every rank
        weights = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
    if trainer.rank == 0:
        torch.save({"weights": weights, "metrics": metrics, "world_size": trainer.world_size}, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:])
