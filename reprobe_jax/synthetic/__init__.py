"""The built-in tiny target: a word-level tokenizer with a chat template (`tokenizer`), its training data and its
training (`train_lm`), interrupted thinking traces for its training data (`interrupt`) and its evaluation on its
own samples (`evaluate`). The job that builds it is `reprobe_jax.jobs.target`."""
