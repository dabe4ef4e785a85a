"""A tiny randomly initialised Qwen2 policy and its tokenizer, built offline for the verl CPU smoke.

Tokenizer: byte-level BPE (``tokenizers``) trained on the shipped MATH L3-5 problems and solutions,
``TINY_VOCAB`` entries including the ChatML special tokens ``<|endoftext|>`` (padding), ``<|im_start|>``
and ``<|im_end|>`` (end of a turn, the EOS), with a ChatML chat template, so verl's Qwen
continuous-token builder (``model_type`` qwen2) applies unchanged. Model: ``Qwen2ForCausalLM`` from a
``Qwen2Config`` (``SPEC``), weights drawn with ``torch.manual_seed(seed)``; 656,512 parameters.

Nothing is downloaded. :func:`build` writes both into one directory in Hugging Face format (what
``actor_rollout_ref.model.path`` points at) and is a no-op when that directory already holds the same
build (``poise_tiny_model.json`` records the spec, the seed and the data's sha256).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from trainer_template.verl_backend.data_prep import SOURCE, SOURCE_SHA256

TINY_VOCAB = 2048
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPEC = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
}
# ChatML: every message as <|im_start|>ROLE\nCONTENT<|im_end|>\n, then the assistant header.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
MARKER = "poise_tiny_model.json"


def _corpus(path: Path = SOURCE):
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            yield row["problem"]
            yield row["solution"]


def build_tokenizer(vocab: int = TINY_VOCAB):
    """A ``PreTrainedTokenizerFast`` (byte-level BPE over the shipped MATH text; deterministic)."""
    # lazy: transformers is heavy (only this path needs it)
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=PAD, unk_token=None, bos_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(out_dir: str | Path, seed: int = 0) -> Path:
    """Write the tokenizer and a seeded random ``Qwen2ForCausalLM`` into ``out_dir``; returns it."""
    out = Path(out_dir)
    stamp = {"spec": SPEC, "vocab": TINY_VOCAB, "seed": seed, "data_sha256": SOURCE_SHA256}
    marker = out / MARKER
    if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == stamp:
        return out
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch  # lazy: torch is heavy (only this path needs it)

    # lazy: transformers is heavy (only this path needs it)
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    # lazy: transformers is heavy (only this path needs it)
    from transformers.utils import logging as hf_logging

    tok = build_tokenizer()
    cfg = Qwen2Config(
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.convert_tokens_to_ids(IM_START),
        **SPEC,
    )
    cfg.architectures = ["Qwen2ForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    out.mkdir(parents=True, exist_ok=True)
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the library reports nothing on its own
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, do_sample=True
    ).save_pretrained(out)
    tok.save_pretrained(out)
    marker.write_text(json.dumps(stamp, sort_keys=True), encoding="utf-8")
    return out


def n_parameters(path: str | Path) -> int:
    """Parameters of the model saved at ``path`` (counted from its config, without loading it)."""
    import torch  # lazy: torch is heavy (only this path needs it)

    # lazy: transformers is heavy (only this path needs it)
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return sum(p.numel() for p in model.parameters())
