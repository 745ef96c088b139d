"""The smallest TRL fine-tuning the tests run: ``SFTTrainer`` with a PEFT LoRA adapter on a tiny
Llama made in code (random weights, a word-level tokenizer built here, 48 sentences drawn from a
seeded generator): nothing is downloaded. The same ``train`` runs under torchrun (this file as a
script) and in nbtrain's ranks, and reports what must match bitwise: the logged losses and a
digest of the trained adapter.

Used in ranks: imported there by reference (the tests' folder is on the ranks' ``sys.path``)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "log", "red", "blue",
         "big", "small", "fast", "slow", "and", "then"]
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>")


def sentences() -> Any:
    import random

    from datasets import Dataset

    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(48)]
    return Dataset.from_dict({"text": texts})


def model(vocab_size: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)
    return LlamaForCausalLM(config)


def train(out: str, live_view: bool = False) -> dict[str, Any]:
    from peft import LoraConfig, get_peft_model_state_dict
    from trl import SFTConfig, SFTTrainer

    words = tokenizer()
    args = SFTConfig(
        output_dir=out, use_cpu=True, max_steps=6, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, learning_rate=5e-3, logging_steps=1,
        save_strategy="no", report_to=[], seed=0, max_length=32, disable_tqdm=live_view,
    )
    callbacks = []
    if live_view:
        from nbtrain import NbtrainCallback

        callbacks.append(NbtrainCallback())
    trainer = SFTTrainer(
        model=model(len(words)), args=args, train_dataset=sentences(), processing_class=words,
        callbacks=callbacks,
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                               target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    trainer.train()
    adapter = get_peft_model_state_dict(trainer.model)
    digest = hashlib.sha256()
    for name in sorted(adapter):
        digest.update(name.encode())
        digest.update(adapter[name].detach().contiguous().numpy().tobytes())
    result = {
        "rank": int(os.environ.get("RANK", "0")),
        "world": args.world_size,
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "adapter": digest.hexdigest(),
    }
    with open(os.path.join(out, f"result-{result['rank']}.json"), "w") as file:
        json.dump(result, file)
    return result


if __name__ == "__main__":  # under torchrun: python -m torch.distributed.run ... tinysft.py OUT
    train(sys.argv[1])
