"""Sharding by logical names: the rules table, the mesh, and sharded vs unsharded parity on 8 CPU devices.

The parity check needs `XLA_FLAGS=--xla_force_host_platform_device_count=8` before jax is imported, so it runs in a
subprocess; the unit tests of `ShardingCtx.spec` build meshes from the one host device, reshaped as needed.
"""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from reprobe_jax.models.sharding import DEFAULT_RULES, ShardingCtx, make_mesh, maybe_initialize_distributed


class _FakeMesh:
  """Just the `shape` mapping that `ShardingCtx.spec` reads, so an 8-way mesh needs no 8 devices here."""

  def __init__(self, **shape):
    self.shape = shape


def _ctx(data=2, fsdp=2, tensor=2):
  return ShardingCtx(_FakeMesh(data=data, fsdp=fsdp, tensor=tensor))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ ShardingCtx.spec


def test_spec_maps_logical_names_to_mesh_axes():
  ctx = _ctx()
  assert ctx.spec(("embed", "heads"), (64, 64)) == P("fsdp", "tensor")
  assert ctx.spec(("vocab", "embed"), (128, 64)) == P("tensor", "fsdp")
  assert ctx.spec(("batch", "seq", "embed"), (8, 16, 64)) == P(("data", "fsdp"), None, None)
  assert ctx.spec(("norm",), (64,)) == P(None)
  assert ctx.spec((None, "unknown_name"), (4, 4)) == P(None, None)


def test_spec_replicates_a_dimension_the_mesh_does_not_divide():
  ctx = _ctx()
  assert ctx.spec(("embed", "mlp"), (64, 99)) == P("fsdp", None)
  assert ctx.spec(("embed", "mlp"), (63, 98)) == P(None, "tensor")
  # batch 2 is not divisible by data*fsdp=4: replicated, which leaves fsdp free for the embedding.
  assert ctx.spec(("batch", "seq", "embed"), (2, 16, 64)) == P(None, None, "fsdp")


def test_spec_uses_each_mesh_axis_at_most_once():
  ctx = _ctx()
  assert ctx.spec(("embed", "embed"), (64, 64)) == P("fsdp", None)
  assert ctx.spec(("heads", "mlp", "vocab"), (8, 8, 8)) == P("tensor", None, None)
  # batch takes data and fsdp together, so a later embed dimension must stay replicated.
  assert ctx.spec(("batch", "embed"), (8, 64)) == P(("data", "fsdp"), None)


def test_spec_ignores_size_one_and_absent_mesh_axes():
  assert _ctx(data=8, fsdp=1, tensor=1).spec(("embed", "heads"), (64, 64)) == P(None, None)
  # a size-1 axis inside a group is harmless: batch is split 8 ways either way
  assert _ctx(data=8, fsdp=1, tensor=1).spec(("batch", "embed"), (8, 64)) == P(("data", "fsdp"), None)
  assert _ctx(data=8, fsdp=1, tensor=1).spec(("batch", "embed"), (4, 64)) == P(None, None)
  only_tensor = ShardingCtx(_FakeMesh(tensor=4))  # type: ignore[arg-type]
  assert only_tensor.spec(("batch", "heads"), (8, 8)) == P(None, "tensor")


def test_spec_without_shape_skips_the_divisibility_check():
  assert _ctx().spec(("embed", "mlp")) == P("fsdp", "tensor")


def test_custom_rules_table():
  rules = tuple((k, None) if k == "embed" else (k, v) for k, v in DEFAULT_RULES)
  ctx = ShardingCtx(_FakeMesh(data=2, fsdp=2, tensor=2), rules)  # type: ignore[arg-type]
  assert ctx.spec(("embed", "heads"), (64, 64)) == P(None, "tensor")


def test_ctx_is_hashable_for_static_jit_arguments():
  mesh = make_mesh(data=1, fsdp=1, tensor=1)
  assert hash(ShardingCtx(mesh)) == hash(ShardingCtx(mesh))
  assert ShardingCtx(mesh) == ShardingCtx(mesh)


# ------------------------------------------------------------------------------------------------ make_mesh


def test_make_mesh_fills_the_minus_one_axis():
  devices = [jax.devices()[0]] * 8  # make_mesh only reshapes the list here
  mesh = make_mesh(data=-1, fsdp=2, tensor=2, devices=devices)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  mesh = make_mesh(data=1, fsdp=-1, tensor=2, devices=devices)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}
  assert isinstance(make_mesh(), Mesh)
  assert make_mesh().shape["data"] == jax.device_count()


def test_make_mesh_axes_are_auto_with_and_without_devices():
  """The library shards by `with_sharding_constraint` (GSPMD style), which needs Auto axes; jax.make_mesh
  defaults to Explicit axes, while a Mesh built from a device list defaults to Auto."""
  auto = jax.sharding.AxisType.Auto
  assert make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1]).axis_types == (auto,) * 3
  assert make_mesh(data=1, fsdp=1, tensor=1).axis_types == (auto,) * 3


def test_make_mesh_argument_errors():
  devices = [jax.devices()[0]] * 8
  with pytest.raises(ValueError, match="at most one mesh axis may be -1"):
    make_mesh(data=-1, fsdp=-1, tensor=2, devices=devices)
  with pytest.raises(ValueError, match="8 devices do not divide"):
    make_mesh(data=-1, fsdp=3, tensor=1, devices=devices)
  with pytest.raises(ValueError, match=r"needs 4 devices, have 8"):
    make_mesh(data=2, fsdp=2, tensor=1, devices=devices)
  with pytest.raises(ValueError, match=r"needs 16 devices, have 8"):
    make_mesh(data=2, fsdp=4, tensor=2, devices=devices)


# ------------------------------------------------------------------------------------------------ distributed


def test_maybe_initialize_distributed_is_a_no_op_on_one_host(monkeypatch):
  for k in ("JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS"):
    monkeypatch.delenv(k, raising=False)
  assert maybe_initialize_distributed() is False
  # A single-host TPU VM names only itself: still no coordinator to join.
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")
  assert maybe_initialize_distributed() is False


# ------------------------------------------------------------------------------------------------ 8-device parity

_PARITY_SCRIPT = textwrap.dedent("""
    import os, sys, tempfile
    import numpy as np
    import torch
    import transformers
    import jax
    from flax import nnx
    from jax.sharding import PartitionSpec as P

    from reprobe_jax.models import CaptureSpec, SamplingParams, load_pretrained, make_mesh

    assert jax.device_count() == 8, jax.devices()
    torch.manual_seed(0)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=99, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    directory = os.path.join(tempfile.mkdtemp(), "tiny-llama")
    transformers.LlamaForCausalLM(hf_cfg).eval().save_pretrained(directory)

    plain = load_pretrained(directory, tokenizer=False)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharded = load_pretrained(directory, mesh=mesh, tokenizer=False)

    # ---- parameters really live on their shardings
    flat = {".".join(map(str, k)): v.get_value() for k, v in nnx.to_flat_state(sharded.params)}
    def spec(name):
      s = flat[name].sharding
      assert s.mesh.shape == mesh.shape, (name, s)
      return tuple(s.spec) + (None,) * (flat[name].ndim - len(s.spec))
    q = flat["layers.0.self_attn.q_proj.kernel"]
    assert not q.sharding.is_fully_replicated, q.sharding
    assert spec("layers.0.self_attn.q_proj.kernel") == ("fsdp", "tensor"), spec("layers.0.self_attn.q_proj.kernel")
    assert spec("layers.1.self_attn.k_proj.kernel") == ("fsdp", "tensor")
    assert spec("layers.0.self_attn.o_proj.kernel") == ("tensor", "fsdp")
    assert spec("embed_tokens") == ("tensor", "fsdp")
    assert spec("lm_head") == ("fsdp", "tensor")
    # intermediate_size 99 is odd: the mlp dimension falls back to replication, the embed one stays sharded.
    assert spec("layers.0.mlp.gate_proj.kernel") == ("fsdp", None)
    assert spec("layers.0.mlp.down_proj.kernel") == (None, "fsdp")
    assert flat["norm.scale"].sharding.is_fully_replicated
    # each device holds only its shard of q_proj: [64, 64] / (fsdp 2 x tensor 2)
    assert {s.data.shape for s in q.addressable_shards} == {(32, 32)}
    for name, v in flat.items():
      plain_v = {".".join(map(str, k)): w.get_value() for k, w in nnx.to_flat_state(plain.params)}[name]
      np.testing.assert_array_equal(np.asarray(v), np.asarray(plain_v), err_msg=name)

    # ---- forward with capture
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 128, size=(4, 12)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, :3] = 0  # left padding on one row
    mask[3, :5] = 0
    cap = CaptureSpec(hidden_layers=(0, 1, 2), attn_window=4, top_k_probs=3, token_stats=True)
    a = plain.forward(ids, mask, capture=cap)
    b = sharded.forward(ids, mask, capture=cap)
    assert not b.logits.sharding.is_fully_replicated, b.logits.sharding
    np.testing.assert_allclose(np.asarray(b.logits), np.asarray(a.logits), atol=1e-5, rtol=1e-5)
    assert sorted(a.hidden_states) == sorted(b.hidden_states) == [0, 1, 2]
    for i in a.hidden_states:
      np.testing.assert_allclose(np.asarray(b.hidden_states[i]), np.asarray(a.hidden_states[i]), atol=1e-5,
                                 rtol=1e-5, err_msg=f"hidden_{i}")
    assert a.attn_window.shape == (4, 12, 2, 4, 4)
    np.testing.assert_allclose(np.asarray(b.attn_window), np.asarray(a.attn_window), atol=1e-5)
    np.testing.assert_allclose(np.asarray(b.top_probs), np.asarray(a.top_probs), atol=1e-5)
    np.testing.assert_allclose(np.asarray(b.token_logprobs), np.asarray(a.token_logprobs), atol=1e-5)
    np.testing.assert_allclose(np.asarray(b.token_entropy), np.asarray(a.token_entropy), atol=1e-5)

    # ---- generate: greedy and seeded sampling, with captured features
    prompts = [[1, 5, 9, 33], [1, 7], [1, 100, 101, 102, 103, 4], [1, 64, 65]]
    gcap = CaptureSpec(hidden_layers=(-1,), attn_window=3, top_k_probs=2, token_stats=True)
    for params, kw in [(SamplingParams(temperature=0.0), dict(n=1)),
                       (SamplingParams(temperature=1.0, top_k=20, top_p=0.9), dict(n=2, seed=7)),
                       (SamplingParams(temperature=0.7), dict(n=1, seed=3))]:
      ga = plain.generate(prompts, params, max_new_tokens=10, capture=gcap, **kw)
      gb = sharded.generate(prompts, params, max_new_tokens=10, capture=gcap, **kw)
      np.testing.assert_array_equal(gb.tokens, ga.tokens, err_msg=str(params))
      np.testing.assert_array_equal(gb.lengths, ga.lengths)
      assert gb.finish_reason == ga.finish_reason
      np.testing.assert_allclose(gb.logprobs, ga.logprobs, atol=1e-5, err_msg=str(params))
      expected = ["attn_window", "hidden_2", "top_probs", "token_entropy", "token_self_certainty"]
      assert sorted(ga.features) == sorted(gb.features) == sorted(expected)
      for k in ga.features:
        np.testing.assert_allclose(gb.features[k], ga.features[k], atol=1e-5, rtol=1e-5, err_msg=k)
      assert ga.tokens.shape == (len(prompts) * kw["n"], 10)
    print("PARITY OK")
""")


@pytest.mark.slow  # a subprocess on 8 host devices (about 50 s on 2 cores); .ci/run runs it
def test_sharded_load_forward_and_generate_match_unsharded(tmp_path):
  script = tmp_path / "parity.py"
  script.write_text(_PARITY_SCRIPT)
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  env["JAX_PLATFORMS"] = "cpu"
  for k in ("JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS"):
    env.pop(k, None)
  proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and "PARITY OK" in proc.stdout, (
    f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}"
  )


def test_single_device_mesh_loads_replicated(tmp_path):
  """A 1x1x1 mesh on this process's one device: everything is replicated and forward still works."""
  from reprobe_jax.models import ModelConfig, LanguageModel, load_pretrained

  cfg = ModelConfig(
    family="llama",
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    max_position_embeddings=64,
  )
  LanguageModel.random(cfg, seed=0).save_pretrained(str(tmp_path / "m"))
  mesh = make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  model = load_pretrained(str(tmp_path / "m"), mesh=mesh, tokenizer=False)
  plain = load_pretrained(str(tmp_path / "m"), tokenizer=False)
  ids = np.arange(1, 9, dtype=np.int32)[None]
  np.testing.assert_allclose(np.asarray(model.forward(ids).logits), np.asarray(plain.forward(ids).logits), atol=1e-6)
