"""A byte-level BPE tokenizer for the synthetic worlds, with a ChatML template and think tags.

Byte-level BPE round-trips any text exactly (step spans and ".\\n\\n" boundaries depend on that), and is the
same kind of tokenizer the real target models use. Saved in Hugging Face format, so `AutoTokenizer` loads it.
"""

from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from reprobe_jax.steps import THINK_CLOSE, THINK_OPEN

PAD, BOS, IM_START, IM_END = "<|pad|>", "<|bos|>", "<|im_start|>", "<|im_end|>"
SPECIAL = [PAD, BOS, IM_START, IM_END]

CHAT_TEMPLATE = (
  "{% for message in messages %}"
  "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
  "{% endfor %}"
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
  """Trains byte-level BPE on `corpus`; special tokens get ids 0..3, think tags 4..5 (kept when decoding)."""
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=SPECIAL + [THINK_OPEN, THINK_CLOSE],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(corpus, trainer=trainer)
  fast = PreTrainedTokenizerFast(
    tokenizer_object=tok, bos_token=BOS, eos_token=IM_END, pad_token=PAD, additional_special_tokens=[IM_START]
  )
  fast.add_tokens([THINK_OPEN, THINK_CLOSE])  # ordinary added tokens: never split, never skipped in decode
  fast.chat_template = CHAT_TEMPLATE
  return fast


def chat_prompt(tokenizer, user_text: str) -> str:
  """The user turn plus the assistant header, as text (the model's prompt)."""
  return tokenizer.apply_chat_template(
    [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True
  )
