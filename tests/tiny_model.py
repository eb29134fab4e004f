"""A tiny random Qwen3 and a byte-level BPE tokenizer with a chat template, built offline.

Shared test helper (no download): the tokenizer is trained on the fly with `tokenizers`; the model
is `Qwen3ForCausalLM` from a small `Qwen3Config` with seeded random weights. Its outputs are
nonsense, which is the point for testing failure handling.
"""

from __future__ import annotations

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "yes no Yes No YES NO yes. no. Yes, No,",
    "You are a strict grader. Judge one attempt by an agent against a rubric of criteria.",
    "Task: put a clean apple in the fridge. Buy a red cotton shirt under 30 dollars.",
    "Observation 0: You are in the middle of a room. Action 1: go to countertop 1",
    "Observation 1: On the countertop 1, you see an apple 1 and a knife 2. Nothing happens.",
    "Action 2: take apple 1 from countertop 1 Action 3: open fridge 1 search[red shirt] click[Buy Now]",
    'Answer with only this JSON object: {"scores": [s1, s2, s3, s4, s5]} numbers between 0 and 1',
    "The agent searches, checks options, opens receptacles, and does not repeat failed actions.",
    "Judging only from evidence visible in the transcript, does the attempt meet the criterion?",
    "Process rubric for this task (privileged guidance): 1. 2. 3. 4. 5. 6. 7. 8.",
    "0123456789 [] {} () , . : ; ' \" - _ < > / = ? !",
]


def make_tiny_tokenizer(vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_tiny_qwen3(tokenizer, seed: int = 0, initializer_range: float = 0.2, layers: int = 2):
    """A `layers`-layer Qwen3 (hidden 64) with seeded random weights; a wide init makes its next-token
    distributions far from uniform, so tests that compare probabilities can tell positions apart."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=4096, tie_word_embeddings=True,
                         initializer_range=initializer_range,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    return model.eval()
