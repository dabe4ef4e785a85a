"""A tiny randomly initialised causal LM with a character-level tokenizer, built locally (nothing is
downloaded): for CPU smoke runs of the generation backends and the suite."""

from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]
# A ChatML template (the Qwen format) in Jinja, so the chat-template path is exercised.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tiny_model(
    path: str | Path, chat_template: bool = True, hidden: int = 32, layers: int = 2, seed: int = 0
) -> Path:
    """Write a tiny Llama (``hidden`` wide, ``layers`` deep, random weights) and a char-level tokenizer to ``path``."""
    import torch  # lazy: torch is heavy (only this path needs it)

    # lazy: transformers is heavy (only this path needs it)
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    chars = sorted(set(string.printable) | set("{}\\$^_"))
    vocab = {tok: i for i, tok in enumerate(SPECIALS + [c for c in chars if c not in SPECIALS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(
        Regex("<\\|im_(?:start|end)\\|>|[\\s\\S]"), behavior="isolated"
    )
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<|im_end|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    if chat_template:
        fast.chat_template = CHATML
    fast.save_pretrained(path)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=vocab["<pad>"],
        eos_token_id=vocab["<|im_end|>"],
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path
