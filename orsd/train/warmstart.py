"""Warm start: a short supervised fit on expert demonstrations, in the rollout's own format.

A 135M model zero-shot almost never writes a valid `<action>`, so every reward in a group is
equal and neither GRPO nor ORSD has a signal. Demonstrations come from `env.expert_action()`
played in the same chat format the policy sees during rollouts; with `noise` > 0 a random command
is sometimes executed instead of the expert's (the label stays the expert's), so the demos also
cover states off the expert's path (DAgger-style). A model fitted on actions alone answers every
prompt with an action, the bundle prompt included, so a few bundle-format demonstrations
(`collect_bundle_demos`) keep it writing numbered criteria: by default criteria written from each
demonstration group's own task and episodes (bundle_demos.py), or drawn from a fixed pool.
Over 400 lines because the demonstrations, the fit, its child process and the record it leaves
for later runs are one procedure whose parts share the same settings.
"""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from orsd.engines import frozen, prefill
from orsd.methods import make_method
from orsd.envs.prompts import demonstration_answer

from .bundle_demos import criteria_pool, play
from .forward import train_logprobs
from .model import autocast, freeze_below, trim_heap
from .packing import batch_positions, budget_batches, pack
from .rollout import build_context


@dataclass
class Demo:
    context_ids: list[int]
    response_ids: list[int]


def collect_demos(env, tokenizer, episodes: int, max_context_tokens: int, rng: random.Random,
                  noise: float = 0.0, max_actions: int = 0, max_history_turns: int = 0,
                  templates=None) -> list[Demo]:
    """One demonstration per expert turn of `episodes` episodes, in the rollout's chat format."""
    demos = []
    for _ in range(episodes):
        trajectory, turns = play(env, env.sample_task(rng), rng, noise, max_actions,
                                 lambda episode, t: build_context(tokenizer, episode, t, max_context_tokens,
                                                                  max_history_turns, templates)[0])
        demos += [Demo(context, answer_ids(tokenizer, demonstration_answer(env.name, expert)))
                  for context, expert in turns]
    return demos


def collect_bundle_demos(env, tokenizer, count: int, group_size: int, transcript_chars: int,
                         rng: random.Random, template=None, max_actions: int = 0, kind: str = "content",
                         log=None) -> list[Demo]:
    """Bundle-format demonstrations: the real generation prompt (task + `group_size` transcripts,
    never a reward) answered by 5–8 criteria. `kind` (warm_start.bundle_demos_kind): content (the
    criteria the group's better episodes satisfy and its worse ones do not, in this task's words:
    orsd/train/bundle_demos.py) where the env has a writer for them, else pool (criteria drawn from
    criteria_pool.yaml whatever the task). `log` hears when content falls back to the pool."""
    from . import bundle_demos

    if kind not in ("content", "pool"):
        raise ValueError(f"kind={kind!r}: expected 'content' or 'pool' (warm_start.bundle_demos_kind)")
    if kind == "content" and bundle_demos.writes_content(env):
        made = bundle_demos.content_demos(env, tokenizer, count, group_size, transcript_chars, rng, template,
                                          max_actions, log)
    else:
        if kind == "content" and log is not None and count:
            log(f"bundle demonstrations: no content-bearing ones for env {env.name!r} "
                f"({type(env).__name__}); its {count} bundle demonstrations draw from the criteria pool")
        pool = criteria_pool(env.name)
        made = [bundle_demos.pool_demo(env, tokenizer, pool, group_size, transcript_chars, rng, template, max_actions)
                for _ in range(count)]
    return [Demo(d.prompt_ids, answer_ids(tokenizer, d.answer)) for d in made]


def answer_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


def warm_start(model, demos: list[Demo], epochs: int, lr: float, batch_size: int, seed: int = 0,
               progress=None, precision: str = "", micro_batch_tokens: int = 2048,
               lm_head: str = "fused", train_layers: int = 0, share_prefix: bool = False,
               reuse_frozen: bool = True, token_budget: int = 4096, detach_context: bool = False) -> list[float]:
    """Cross-entropy on the demonstration answers only (mean over a batch's answer tokens);
    returns the loss of every optimizer step. Each batch of `batch_size` demonstrations is split
    into micro-batches of at most `micro_batch_tokens` padded tokens, so memory stays bounded
    whatever the prompt lengths. `train_layers` > 0 fits only the top layers (`fitted_layers`);
    `share_prefix` forwards what a micro-batch's demonstrations share once (see train_logprobs).
    `reuse_frozen`: the layers below the fitted ones run once per demonstration, before the first
    epoch, and every forward of the fit starts from their output (`frozen_base`), in forwards of
    `token_budget` padded tokens (replay.token_budget: they keep no graph). `detach_context`: each
    demonstration's context runs without a graph (`detached_context_hidden`), so the backward covers
    only the answers; `micro_batch_tokens` then bounds the answers' tokens, and the contexts' no-grad
    forwards `token_budget`.
    Size: the warm_start section's keys as keywords: its child process and the tests call it without a run
    config."""
    if detach_context and not prefill.serves(model):
        raise ValueError("warm_start.detach_context: needs a model whose keys/values can be cut per row "
                         "(full attention, no gradient checkpointing); set warm_start.detach_context=false")
    with fitted_layers(model, train_layers):
        base = frozen_base(model, demos, precision, token_budget) if reuse_frozen else None
        return _fit(model, demos, epochs, lr, batch_size, seed, progress, precision, micro_batch_tokens, lm_head,
                    share_prefix, base, token_budget if detach_context else 0)


def frozen_base(model, demos: list[Demo], precision: str, token_budget: int) -> tuple | None:
    """(split, per demonstration the states entering layer `split`) when the bottom `split` layers and
    the embeddings are frozen and the model's layers can be run apart (engines/frozen.py); else None.
    What the frozen layers compute for a demonstration is the same in every epoch, so it is computed
    once."""
    split = frozen.frozen_layers(model)
    # under gradient checkpointing the fitted layers run again in the backward, after layer_range
    # has given them back their own cache indices
    if not split or getattr(model, "is_gradient_checkpointing", False):
        return None
    with autocast(model, precision):
        if not frozen.serves(model, split):
            return None
        states = prefill.bottom_states(model, [d.context_ids + d.response_ids for d in demos], split, token_budget)
    trim_heap()
    return split, states


def _fit(model, demos, epochs, lr, batch_size, seed, progress, precision, micro_batch_tokens, lm_head,
         share_prefix, base=None, detached_budget: int = 0) -> list[float]:
    """`detached_budget` > 0: contexts without a graph (see warm_start), forwarded in that many padded tokens.
    Size: warm_start's options passed on to the fitting loop."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    rng = random.Random(seed)
    losses = []
    rows = partial(detached_context_hidden, token_budget=detached_budget) if detached_budget else None
    model.train()
    for _ in range(epochs):
        order = list(range(len(demos)))
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            packed = pack([_as_record(demos[i]) for i in order[start:start + batch_size]])
            states = None if base is None else (base[0], [base[1][i] for i in order[start:start + batch_size]])
            answer_tokens = sum(len(demos[i].response_ids) for i in order[start:start + batch_size])
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            # detached, only each answer and the context token before it are forwarded under autograd
            graphed = ([len(demos[i].response_ids) + 1 for i in order[start:start + batch_size]] if detached_budget
                       else packed.lengths)
            for batch in budget_batches(graphed, micro_batch_tokens):
                positions = batch_positions(packed.response_mask, packed.cu_seqlens, batch)
                logprobs, _, _ = train_logprobs(model, packed.ids, packed.cu_seqlens, batch, positions, 1.0,
                                                precision=precision, lm_head=lm_head, share_prefix=share_prefix,
                                                frozen_states=states, hidden_rows=rows)
                loss = -logprobs.sum() / answer_tokens
                loss.backward()
                total += float(loss.detach())
                del logprobs, loss
                trim_heap()  # the micro-batch's activations are freed: their pages go back
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(total)
            if progress is not None:
                progress(total)
    optimizer.zero_grad(set_to_none=True)  # the fit's gradients: a model's size, and no use to what follows
    return losses


def detached_context_hidden(model, ids: torch.Tensor, cu: torch.Tensor, batch: list[int],
                            positions: list[torch.Tensor], frozen_states: tuple | None = None,
                            token_budget: int = 0) -> torch.Tensor:
    """forward._hidden_rows's final hidden states (predicting each position in `positions[i]` of sequence
    batch[i]) with every position before a sequence's first predicting one, its context, forwarded
    under no_grad: the contexts' keys/values are computed once without a graph (along their prefix
    tree), and each answer with the context token before it continues from them under autograd.

    The values are the whole forward's, up to floating-point order; the gradient is not. It leaves
    out how the fitted layers' weights move the contexts' keys and values, so each step fits the
    answers to contexts as the weights of that step encode them. The contexts are ~93% of the
    default warm start's tokens (~25-token answers to ~450-token prompts), and a no-grad forward
    costs about a third of a forward with its backward (measured: docs/training.md)."""
    from orsd.engines.tree import distinct_rows, tree_forward

    decoder = model.get_decoder()
    device = next(model.parameters()).device
    sequences = [ids[int(cu[s]):int(cu[s + 1])].tolist() for s in batch]
    needed = [(p - int(cu[s]) - 1).tolist() for s, p in zip(batch, positions)]
    if any(not n for n in needed):
        raise ValueError("detached_context_hidden: every sequence needs a position to predict")
    rows, inverse = distinct_rows(sequences)
    prompts = [sequences[row] for row in rows]
    starts = [len(prompt) for prompt in prompts]
    wanted: list[list[int]] = [[] for _ in prompts]
    for i, p in enumerate(inverse):  # a repeated sequence: from the earliest position any copy predicts from
        starts[p] = min(starts[p], needed[i][0])
        wanted[p].append(i)
    if min(starts) < 1:  # a context of no token: nothing to detach, nothing to continue from
        raise ValueError("detached_context_hidden: every sequence needs at least one context token")
    contexts = [prompt[:start] for prompt, start in zip(prompts, starts)]
    context_rows, context_of = distinct_rows(contexts)
    kv: list[list[tuple] | None] = [None] * len(context_rows)
    out: list[torch.Tensor | None] = [None] * len(sequences)
    split, states = frozen_states if frozen_states is not None else (0, None)

    def embed(prompt_rows: list[int]):  # the states entering layer `split`, per prompt index
        if states is None:
            return None
        return lambda i, start, end: states[batch[rows[prompt_rows[i]]]][start:end].to(device)

    def keep_kv(c: int, hidden, start: int, keys_values) -> None:
        kv[c] = [(keys.clone(), values.clone()) for keys, values in keys_values()]  # not views of the batch

    def keep_hidden(p: int, hidden, start: int, keys_values) -> None:
        for i in wanted[p]:
            out[i] = hidden[torch.tensor(needed[i], device=hidden.device) - start]

    with frozen.layer_range(decoder, split, len(decoder.layers)) if states is not None else nullcontext():
        with torch.no_grad():
            tree_forward(decoder, decoder.config, [contexts[c] for c in context_rows], None, device, keep_kv,
                         token_budget, embed=embed(context_rows))
        tree_forward(decoder, decoder.config, prompts, None, device, keep_hidden, token_budget,
                     embed=embed(list(range(len(prompts)))), base=([kv[c] for c in context_of], starts))
    return torch.cat(out)


@contextmanager
def fitted_layers(model, top: int):
    """Within: only the top `top` decoder layers and the decoder's final norm take gradients
    (`freeze_below`); requires_grad is restored on exit. On the 2-core CPU, SmolLM2-135M with 15 of
    30 layers fitted, a warm-start step took ~2/3 of the time."""
    before = freeze_below(model, top, "warm_start.train_layers")
    try:
        yield
    finally:
        for p, flag in (before or {}).items():
            p.requires_grad_(flag)


class _as_record:
    """The two fields `pack` reads, without building a full TurnRecord."""

    def __init__(self, demo: Demo):
        self.context_ids, self.response_ids = demo.context_ids, demo.response_ids

    @property
    def num_tokens(self) -> int:
        return len(self.context_ids) + len(self.response_ids)


def runs_in_child(config, device, distributed: bool) -> bool:
    """warm_start.process: auto isolates the fit on a single-process CPU run, where the heap it leaves
    behind slowed everything after it; on a GPU that cost is absent and a second CUDA context is not
    free, and under a launcher every rank fits in place."""
    mode = config.warm_start.process
    if mode == "child" and distributed:
        raise ValueError("warm_start.process=child: not supported on a distributed run (every rank fits in "
                         "place); use warm_start.process=inline or auto")
    return mode == "child" or (mode == "auto" and not distributed and device.type == "cpu")


def run_warm_start_in_child(config, out_dir, log=print):
    """`run_warm_start` in a new Python process that loads `model.path`, fits it and saves it (weights and
    tokenizer) to `out_dir`, for the caller to load. Returns the fit's losses and the precision the
    child resolved for model.autocast (a probe is a measurement: the run keeps its one decision).

    Why a process: on a CPU the RL stages ran slower in the process that had run the fit than in
    one that had only loaded the fitted weights (docs/warmstart.md). Whatever state the fit leaves
    in the allocator, a process that ends takes it along. Any ops this process's
    self-check set aside are set aside in the child too, and it runs on as many threads."""
    import orsd
    from orsd.ops import _backend

    # a fresh interpreter running this module (not multiprocessing's spawn, which would import the
    # caller's __main__ again: a user script without a __name__ guard would then build twice)
    with tempfile.TemporaryDirectory(prefix="orsd-warm-start-") as scratch:
        job, result = Path(scratch) / "job.pkl", Path(scratch) / "result.pkl"
        # this process's thread count (model.threads, or whatever the caller set): f32 GEMMs round
        # differently on 1 and 2 threads (docs/ops.md), and the fit must be the one done in place
        job.write_bytes(pickle.dumps((config, str(out_dir), dict(_backend._distrusted), torch.get_num_threads())))
        paths = [str(Path(orsd.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        code = subprocess.run([sys.executable, "-m", "orsd.train.warmstart", str(job), str(result)], env=env).returncode
        if code != 0:
            why = (f"was killed by signal {-code} (out of memory?)" if code < 0
                   else f"failed with exit status {code} (its traceback is above)")
            raise RuntimeError(f"the warm start's child process {why}; warm_start.process=inline fits in this "
                               f"process instead")
        losses, lines, precision = pickle.loads(result.read_bytes())
    for line in lines:
        log(line)
    return losses, precision


def _fit_in_child(config, out_dir: str, distrusted: dict, threads: int):
    from orsd import envs
    from orsd.ops import _backend

    from .model import load_policy, load_tokenizer
    from .precision import configure_threads, resolve_autocast

    for kind, reason in distrusted.items():
        _backend.distrust(kind, reason)
    m = config.model
    configure_threads(threads)
    torch.manual_seed(config.train.seed)
    policy = load_policy(m.path, m.dtype, m.device, m.attn_implementation, config.train.seed)
    tokenizer = load_tokenizer(m.path)
    precision = resolve_autocast(policy, m.autocast)
    if m.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    lines = []
    losses = run_warm_start(config, policy, tokenizer, envs.from_config(config.env), lines.append, precision.autocast)
    policy.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return losses, lines, precision


#: written beside a policy a warm start saved (checkpoints/reference/): what the fit showed it
RECORD = "warm_start.json"


def write_record(config, out_dir, writes_bundles: bool) -> None:
    """warm_start.json in `out_dir`: a run that later starts from this policy with its own warm start
    off (`model.path=<run>/checkpoints/reference`, as orsd-study's arms do) still knows that the
    policy saw bundle demonstrations (`bundle_demos_shown`)."""
    import json

    w = config.warm_start
    shown = w.bundle_demos if writes_bundles else 0  # as run_warm_start adds them
    record = {"env": config.env.name, "bundle_demos": shown,
              "bundle_demos_kind": bundle_demos_kind(config) if shown else "",
              "episodes": w.episodes, "epochs": w.epochs, "seed": config.train.seed}
    (Path(out_dir) / RECORD).write_text(json.dumps(record, indent=2) + "\n")


def bundle_demos_shown(config) -> int:
    """Bundle demonstrations the policy at model.path was fitted on: this run's warm start's, or, with
    the warm start off, those an earlier run's warm start recorded beside the policy (write_record)
    for the same env; 0 otherwise."""
    import json

    w = config.warm_start
    if w.enabled:
        return w.bundle_demos
    try:
        record = json.loads((Path(config.model.path) / RECORD).read_text())
    except (OSError, ValueError):  # a model id, random:..., or a policy no warm start saved
        return 0
    return int(record.get("bundle_demos") or 0) if record.get("env") == config.env.name else 0


def bundle_demos_kind(config) -> str:
    """What this run's warm start's bundle demonstrations are: warm_start.bundle_demos_kind, but pool
    where the env has no writer of content-bearing ones (bundle_demos.writes_content)."""
    from orsd.envs import env_class

    from .bundle_demos import writes_content

    kind = config.warm_start.bundle_demos_kind
    backend = config.env.options.get("backend", "generated") if config.env.name == "webshop" else "generated"
    return kind if kind == "pool" or writes_content(env_class(config.env.name, backend)) else "pool"


def bundle_demos_kind_shown(config) -> str:
    """The kind of the bundle demonstrations the policy at model.path was fitted on (as
    bundle_demos_shown finds them): this run's, or the one its record names; "pool" for a record
    written before content-bearing demonstrations existed; "" when it saw none."""
    import json

    if not bundle_demos_shown(config):
        return ""
    if config.warm_start.enabled:
        return bundle_demos_kind(config)
    record = json.loads((Path(config.model.path) / RECORD).read_text())  # bundle_demos_shown read it
    return record.get("bundle_demos_kind") or "pool"


def run_warm_start(config, policy, tokenizer, env, log=print, precision: str | None = None,
                   writes_bundles: bool | None = None) -> list[float]:
    """The configured warm start of `policy` in place; `precision` (default model.autocast) is the
    autocast dtype of its forwards; `writes_bundles` (default: the config's method's) adds the
    bundle demonstrations."""
    from tqdm.auto import tqdm

    from orsd.envs.prompts import prompt_templates

    w, r = config.warm_start, config.rollout
    start = time.perf_counter()
    rng = random.Random(config.train.seed + 7)
    demos = collect_demos(env, tokenizer, w.episodes, r.max_context_tokens - r.max_new_tokens, rng, w.noise,
                          config.env.max_actions, config.env.max_history_turns,
                          prompt_templates(config.env.name, config.env.prompt))
    actions = len(demos)
    if writes_bundles is None:
        writes_bundles = make_method(config).writes_bundles
    if writes_bundles and w.bundle_demos:
        demos += collect_bundle_demos(env, tokenizer, w.bundle_demos, r.group_size, config.rubric.transcript_chars,
                                      rng, config.rubric.generation_template or None, config.env.max_actions,
                                      w.bundle_demos_kind, log)
    steps = w.epochs * -(-len(demos) // w.batch_size)
    show = config.train.progress and os.environ.get("RANK", "0") == "0"  # rank 0 only under a launcher
    with tqdm(total=steps, desc="warm start", unit="step", disable=not show or not demos) as bar:
        def progress(loss: float) -> None:
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            bar.update()

        losses = warm_start(policy, demos, w.epochs, w.lr, w.batch_size, config.train.seed, progress=progress,
                            precision=config.model.autocast if precision is None else precision,
                            micro_batch_tokens=w.micro_batch_tokens,
                            lm_head=config.optim.lm_head, train_layers=w.train_layers,
                            share_prefix=config.optim.share_prefix,
                            reuse_frozen=w.reuse_frozen, detach_context=w.detach_context,
                            token_budget=config.replay.token_budget)  # before any DeepSpeed wrapping
    log(f"warm start: {actions} expert turns from {w.episodes} episodes + {len(demos) - actions} bundle "
        f"demonstrations, {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
        f"{time.perf_counter() - start:.0f} s" if losses else "warm start: no demonstrations collected")
    return losses


if __name__ == "__main__":  # the child of run_warm_start_in_child: job.pkl in, result.pkl out
    job, result = sys.argv[1:3]
    Path(result).write_bytes(pickle.dumps(_fit_in_child(*pickle.loads(Path(job).read_bytes()))))


def draft_corpus(config, tokenizer) -> list[list[int]]:
    """What speculative bundle decoding may copy drafts from besides the prompt and the other
    bundles, when the policy was shown bundle demonstrations, by this run's warm start or by the
    one that saved it: what those demonstrations repeat. Pool demonstrations: the criteria pool,
    numbered as they show it (the policy then writes its lines nearly word for word). Content
    demonstrations: the fixed words of their criterion templates (bundle_demos.template_corpus); the
    words they fill in are the task's and the transcripts', which the prompt already holds."""
    from .bundle_demos import template_corpus

    kind = bundle_demos_kind_shown(config) if config.rubric.draft_tokens else ""
    if not kind:
        return []
    if kind == "content":
        return [tokenizer.encode(piece, add_special_tokens=False) for piece in template_corpus()]
    text = "\n".join(f"{i}. {criterion}" for i, criterion in enumerate(criteria_pool(config.env.name), 1))
    return [tokenizer.encode(text, add_special_tokens=False)]
