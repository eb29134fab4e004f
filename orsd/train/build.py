"""Every factory of a run, from its config: the trainer with its policy, reference, env, engine
and verifier (`build`), and each of those on its own."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from pathlib import Path

from orsd import envs, rubric
from orsd.methods import make_method

from . import lora


def build_verifier(config, frozen_model, tokenizer):
    """A real endpoint when one is configured, else a frozen local model (the reference copy of the
    initial policy; no second copy is made)."""
    v = config.verifier
    kind = v.kind if v.kind != "auto" else ("openai" if v.base_url else "local")
    if kind == "openai":
        return rubric.OpenAIVerifier(
            v.base_url, v.model, api_key_env=v.api_key_env or None, concurrency=v.concurrency,
            max_retries=v.max_retries, timeout=v.timeout_seconds, cache_dir=v.cache_dir or None,
            mode=v.granularity, scoring=v.scoring, max_tokens=v.max_new_tokens, seed=config.train.seed)
    from orsd.train.model import DTYPES
    from orsd.train.precision import resolve_autocast

    precision = resolve_autocast(frozen_model, config.model.autocast).autocast  # the run's, as every forward
    return rubric.LocalVerifier(frozen_model, tokenizer, mode=v.granularity, scoring=v.scoring,
                                max_new_tokens=v.max_new_tokens,
                                max_prompt_tokens=config.rollout.max_context_tokens,
                                autocast_dtype=DTYPES[precision] if precision else None)


def import_model_code() -> None:
    """Imports transformers' model-loading code ahead of `load_policy` (seconds on a small CPU). An
    import that fails here fails again where the model loads, which reports it."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
        from transformers import modeling_utils  # noqa: F401
    except Exception:  # noqa: BLE001 - reported by the load that needs it
        pass


def recorded_precision(run_dir, requested: str):
    """The precision the run's first process chose (its environment.json), for a resumed run to keep:
    'auto' on a CPU without native bf16 measures a matmul, and a measurement under other load can
    choose otherwise, which would change every number after the resume. None where nothing was
    recorded for the same model.autocast."""
    import json

    from orsd.train.precision import Precision

    try:
        recorded = json.loads((Path(run_dir) / "environment.json").read_text()).get("precision") or {}
    except (OSError, ValueError, TypeError):
        return None
    if recorded.get("requested") != requested or "autocast" not in recorded:
        return None
    reason, kept = recorded.get("reason", ""), " (kept from the run's first process on resume)"
    return Precision(requested, recorded["autocast"], reason if reason.endswith(kept) else reason + kept,
                     recorded.get("probe_speedup"))


def make_env(config):
    return envs.from_config(config.env)


def build(config, run_dir=None, resume_from=None, log=print, method=None):
    """Policy, tokenizer, env, (warm start), frozen reference, verifier and trainer from a config;
    `method` (orsd.methods; built from the config when not given) is the one object every part
    asks what the method does.

    On resume the policy comes from the checkpoint and the reference from checkpoints/reference
    (saved when a warm start made it differ from `model.path`); the warm start is not redone.
    Size: the run's factory in dependency order (policy, env, warm start, reference, verifier, engine,
    trainer); each part has its own builder in this module.
    """
    import torch

    from orsd import ops as orsd_ops
    from orsd.train import distributed
    from orsd.train.model import (frozen_copy, load_policy, load_tokenizer, release_memory, resolve_device,
                                  share_frozen)
    from orsd.train.precision import configure_threads, resolve_autocast
    from orsd.train.trainer import Trainer
    from orsd.train.warmstart import run_warm_start, run_warm_start_in_child, runs_in_child, write_record

    method = method or make_method(config)
    torch.manual_seed(config.train.seed)
    dist = distributed.setup(config)
    m = config.model
    threads = configure_threads(m.threads)
    device = f"cuda:{dist.local_rank}" if dist and torch.cuda.is_available() else m.device
    ops_check = check_ops(where := resolve_device(device), m.ops_self_check, log)  # before any model loads
    reference_dir = Path(run_dir) / "checkpoints" / "reference" if run_dir else None
    warm_losses, decided = [], (recorded_precision(run_dir, m.autocast) if resume_from is not None else None)
    in_child = (resume_from is None and config.warm_start.enabled
                and runs_in_child(config, where, dist is not None))
    if in_child:  # before this process loads any weights: the child's peak and ours are resident together
        # meanwhile this process imports the model-loading code it will need, on a core that the
        # child's single-threaded start leaves free, at the price of that code's memory beside the child
        imports = threading.Thread(target=import_model_code, name="orsd-imports", daemon=True)
        imports.start()
        with contextlib.nullcontext(reference_dir) if reference_dir else tempfile.TemporaryDirectory() as out:
            warm_losses, decided = run_warm_start_in_child(config, out, log)
            imports.join()
            policy = load_policy(str(out), m.dtype, device, m.attn_implementation, config.train.seed)
    else:
        policy = load_policy(str(resume_from or m.path), m.dtype, device, m.attn_implementation, config.train.seed)
    tokenizer = load_tokenizer(m.path)
    # every autocast(policy, m.autocast) uses this choice (the child's, when it fitted the policy)
    precision = resolve_autocast(policy, m.autocast, decided)
    log(f"precision: model.autocast={m.autocast or 'off'} -> {precision.autocast or 'fp32'} ({precision.reason}); "
        f"{threads.count} CPU threads ({threads.reason})")
    env = make_env(config)
    if m.gradient_checkpointing:  # before the warm start, whose micro-batches it shrinks as the update's
        policy.gradient_checkpointing_enable()
    base_path = str(reference_dir if resume_from is not None and reference_dir and reference_dir.exists()
                    else m.path)  # what LoRA's adapters adapt (a warm start's below)
    if resume_from is not None and lora.enabled(m.lora):  # the checkpoint holds only the adapters
        policy = load_policy(base_path, m.dtype, device, m.attn_implementation, config.train.seed)
        reference = None  # the base view, made below
    elif resume_from is not None:
        reference = frozen_copy(load_policy(base_path, m.dtype, device, m.attn_implementation, config.train.seed),
                                precision.autocast)
    else:
        if config.warm_start.enabled and not in_child:
            warm_losses = run_warm_start(config, policy, tokenizer, env, log,  # same on every rank
                                         writes_bundles=method.writes_bundles)
            if reference_dir is not None and (dist is None or dist.is_main):
                policy.save_pretrained(reference_dir)
                tokenizer.save_pretrained(reference_dir)
        if config.warm_start.enabled and reference_dir is not None and (dist is None or dist.is_main):
            # beside the warm-started policy: orsd-study starts arms from it
            write_record(config, reference_dir, method.writes_bundles)
        if config.warm_start.enabled and reference_dir is not None:
            base_path = str(reference_dir)
        # π_ref: the policy as RL starts (after any warm start); LoRA's is the base view, made below
        reference = None if lora.enabled(m.lora) else frozen_copy(policy, precision.autocast)
    release_memory()  # the warm start's optimizer, gradients and activations are gone
    if lora.enabled(m.lora):
        reference = adapt(policy, config, resume_from, log)
    freeze_for_update(policy, config, precision.autocast, distributed=dist is not None, log=log)
    if dist is None and (shared := share_frozen(policy, reference)):  # ZeRO partitions the policy's own
        log(f"reference: shares the embeddings and the {shared} frozen layers below with the policy")
    verifier = build_verifier(config, reference, tokenizer) if method.calls_verifier else None
    engine = build_engine(config, policy, tokenizer, run_dir, dist)
    ds_engine = distributed.wrap(policy, config) if dist else None
    trainer = Trainer(config, policy, tokenizer, reference, verifier, env, engine=engine, dist=dist,
                      ds_engine=ds_engine, method=method)
    trainer.base_path = base_path
    # which implementation serves each device, now that the self-check may have set one aside; first
    # of build's entries, where environment.json has always had it
    trainer.environment["ops_backend"] = orsd_ops.backend()
    trainer.environment["ops_self_check"] = ops_check
    trainer.environment["overlap"] = trainer.overlaps()  # replay.overlap where it serves (train/overlap.py)
    if trainer.overlaps():
        log("overlap: the policy writes bundles beside the plain pass (replay.overlap)")
    trainer.environment["precision"] = {**precision.as_dict(), "threads": threads.count,
                                        "threads_reason": threads.reason}
    sizes = [(getattr(p, "ds_numel", p.numel()), p.requires_grad) for p in policy.parameters()]  # ZeRO-3 partitions
    trainer.environment["parameters"] = {"trainable": sum(n for n, grad in sizes if grad), "total": sum(n for n, _ in sizes)}
    trainer.environment["openmp"] = {name: os.environ.get(name, "") for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY",
                                                                                 "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}
    return trainer, warm_losses


def adapt(policy, config, resume_from, log=print):
    """model.lora: the reference (and local verifier) as a view of the policy's base, then peft's
    adapters in the policy, loaded from the checkpoint on resume. Returns the reference."""
    reference = lora.base_view(policy)
    trainable = lora.inject(policy, config.model.lora, config.optim.train_layers)  # LoraError names the key
    if resume_from is not None:
        lora.load_adapters(policy, resume_from)
    total = sum(p.numel() for p in policy.parameters())
    layers = lora.adapted_layers(policy, config.optim.train_layers)
    where = f"the top {len(layers)} layers" if layers else "every layer"
    log(f"update: LoRA rank {config.model.lora.rank} adapters in {where} ({trainable / 1e6:.2f}M of "
        f"{total / 1e6:.1f}M parameters); the reference is the base without them (no copy)")
    return reference


def freeze_for_update(policy, config, autocast: str, distributed: bool = False, log=print) -> None:
    """optim.train_layers: freeze all but the top layers before any optimizer is built over the
    policy. Single-process, the frozen linears are then stored in the autocast dtype (autocast
    caches casts only of weights that require grad, so frozen f32 ones were cast at every forward);
    under DeepSpeed they keep the policy's dtype, as ZeRO partitions them with the rest."""
    from orsd.train.model import freeze_below, store_frozen_linears

    if freeze_below(policy, config.optim.train_layers, "optim.train_layers") is None:
        return
    if not distributed:
        store_frozen_linears(policy, autocast)
    if lora.enabled(config.model.lora):  # adapt() has said what trains
        return
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    log(f"update: the top {config.optim.train_layers} decoder layers and the final norm "
        f"({trainable / 1e6:.1f}M of {sum(p.numel() for p in policy.parameters()) / 1e6:.1f}M parameters)")


def check_ops(device, on_failure: str, log=print, ops=None) -> dict:
    """Run every op's self-check on the run's device before the run trusts its kernels (a kernel
    miscompiled for this GPU would silently corrupt Δ and the update). On a mismatch: "error" stops
    the run with the report; "fallback" sets the device's kernels aside (the torch reference runs
    every op from then on) and says so loudly; "off" skips the check. `ops` replaces the ops under
    test (tests hand in a deliberately wrong one)."""
    import warnings

    from orsd import ops as orsd_ops
    from orsd.ops.selfcheck import SelfCheckError, self_check

    if on_failure == "off":
        return {"skipped": "model.ops_self_check=off"}
    results = self_check(device, ops)
    failed = {name: r for name, r in results.items() if not r["ok"]}
    report = {"device": str(device), "ok": not failed, "ops": results}
    if not failed:
        log(f"ops self-check on {device}: {len(results)} ops agree with the reference")
        return report
    error = SelfCheckError(device, results)
    if on_failure == "error":
        raise SystemExit(f"orsd-train: {error}\n(model.ops_self_check=fallback runs the torch reference "
                         f"ops instead; please report this with the output of orsd-doctor)")
    orsd_ops._backend.distrust(device.type, f"{sorted(failed)} disagreed on {device}")
    warnings.warn(f"{error}\nFALLING BACK to the torch reference ops on {device.type} for the whole run "
                  f"(model.ops_self_check=fallback): correct but slower", RuntimeWarning, stacklevel=2)
    log(f"ops self-check FAILED on {device}: {sorted(failed)}; using the torch reference ops")
    report["fallback"] = True
    return report


def build_engine(config, policy, tokenizer, run_dir, dist=None):
    """`hf` generates with the live policy; `vllm` starts from a saved copy of the current policy
    and is pushed the new weights after every update."""
    from orsd.engines.hf import HfEngine

    from .warmstart import draft_corpus

    r = config.rollout
    if r.engine == "hf":
        return HfEngine(policy, tokenizer, r.batch_size, draft_corpus=draft_corpus(config, tokenizer))
    from orsd.engines.vllm import VllmEngine

    start = Path(run_dir or ".") / "checkpoints" / "vllm_start"
    if dist is None or dist.is_main:
        if lora.enabled(config.model.lora):  # vLLM knows the base architecture: the adapters merged in
            lora.save_merged(policy, start)
        else:
            policy.save_pretrained(start)
        tokenizer.save_pretrained(start)
    if dist is not None:
        dist.barrier()
    on_cpu = next(policy.parameters()).device.type == "cpu"
    return VllmEngine(str(start), tokenizer, dtype=r.vllm_dtype, gpu_memory_utilization=r.vllm_gpu_memory_utilization,
                      max_model_len=r.max_context_tokens + r.max_new_tokens, seed=config.train.seed,
                      sync_timeout_seconds=r.sync_timeout_seconds, enforce_eager=r.vllm_enforce_eager or on_cpu,
                      bucket_mb=r.vllm_bucket_mb)
