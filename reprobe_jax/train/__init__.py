"""Training: one loop for every learner (the target LM, the probe, the PRM, the RL policy) over optax and orbax,
with TensorBoard scalars (`trainer`, `tblog`) and a checksum in every checkpoint, checked on restore (`checksum`),
and the one optimizer config they all embed (`optimizer`)."""
