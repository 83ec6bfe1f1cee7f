"""A HuggingFace transformers causal LM (GPT-2 or Llama) as a profbench model factory.

The model is built from a config with random weights: nothing is downloaded, and no Hub
function is called (profiling machines often cannot reach the Hub).

    runs:
      gpt2_124m: {workload: model, factory: "workloads.models.hf_causal_lm:make", batch: 8,
                  mode: train, dtype: bf16}
      llama_134m: {workload: model, factory: "workloads.models.hf_causal_lm:make",
                   kwargs: {arch: llama, vocab_size: 32000}, batch: 8, mode: train,
                   dtype: bf16}

Needs transformers: ``pip install -e '.[models]'``.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch
import torch.nn.functional as F

from workloads.models.parts import ModelParts, Structure, import_torchvision

ARCHS = ("gpt2", "llama")
# Each decoder block is a layer; its attention, MLP and two norms are the sublayers.
STRUCTURES = {
    "gpt2": Structure(layers="transformer.h.*", sublayers="attn|mlp|ln_1|ln_2"),
    "llama": Structure(layers="model.layers.*",
                       sublayers="self_attn|mlp|input_layernorm|post_attention_layernorm"),
}
# The batch maker's seed: every call, and every run, sees the same tokens.
SEED = 0


def make(arch: str = "gpt2", n_layer: int = 12, n_embd: int = 768, n_head: int = 12,
         vocab_size: int = 50257, context_length: int = 1024,
         attn_implementation: str = "sdpa", intermediate_size: int | None = None,
         dropout: float = 0.0, gradient_checkpointing: bool = False) -> ModelParts:
    """GPT-2 small (124M) by default. ``arch="llama"`` gives a Llama of the same width and
    depth: SwiGLU MLP of ``intermediate_size`` (default 8/3 * n_embd rounded up to a
    multiple of 256, as Llama does), RMSNorm, RoPE, untied embeddings. ``dropout`` is 0 as in
    pretraining, so a step's work does not depend on random masks. ``gradient_checkpointing``:
    the model's own ``gradient_checkpointing_enable()`` (each block's forward recomputed in
    backward)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS}")
    # Any Hub access that slipped in would fail at once instead of waiting on the network.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers

        if importlib.util.find_spec("torchvision") is not None:
            import_torchvision()  # transformers imports it whenever it is installed
    except ImportError as err:
        raise ImportError("workloads.models.hf_causal_lm needs transformers: "
                          "pip install -e '.[models]'") from err

    if arch == "gpt2":
        config = transformers.GPT2Config(
            n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size,
            n_positions=context_length, n_inner=intermediate_size,
            resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
            # GPT-2's end-of-text token is the last one (50256 of 50257).
            bos_token_id=vocab_size - 1, eos_token_id=vocab_size - 1,
            use_cache=False, attn_implementation=attn_implementation,
        )
        model = transformers.GPT2LMHeadModel(config)
    else:
        if intermediate_size is None:
            intermediate_size = 256 * -(-8 * n_embd // (3 * 256))
        config = transformers.LlamaConfig(
            num_hidden_layers=n_layer, hidden_size=n_embd, num_attention_heads=n_head,
            num_key_value_heads=n_head, intermediate_size=intermediate_size,
            vocab_size=vocab_size, max_position_embeddings=context_length,
            attention_dropout=dropout, tie_word_embeddings=False,
            use_cache=False, attn_implementation=attn_implementation,
        )
        model = transformers.LlamaForCausalLM(config)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()

    def make_batch(batch_size: int,
                   device: torch.device) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        # Drawn on the CPU so the tokens are the same on every device.
        generator = torch.Generator().manual_seed(SEED)
        shape = (batch_size, context_length)
        tokens = torch.randint(0, vocab_size, shape, generator=generator)
        targets = torch.randint(0, vocab_size, shape, generator=generator)
        return {"input_ids": tokens.to(device)}, targets.to(device)

    def loss(output: Any, targets: torch.Tensor) -> torch.Tensor:
        # output: the model's CausalLMOutput. The softmax over the vocabulary in fp32,
        # whatever the autocast dtype.
        return F.cross_entropy(output.logits.float().flatten(0, 1), targets.flatten())

    return ModelParts(
        model=model,
        make_batch=make_batch,
        loss=loss,
        structure=STRUCTURES[arch],
        items_per_sample=context_length,
    )
