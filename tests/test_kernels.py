"""The CPU decode kernels (reprobe_jax/kernels): y = x @ w over pre-packed weights and the two attention products,
held to a float64 NumPy product, to XLA's products, and (the matmul) to itself one row at a time; and the decode
view that uses them (`LanguageModel.decode_view`), held to the same decode through XLA's dots."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reprobe_jax import kernels
from reprobe_jax.kernels import build as build_lib
from reprobe_jax.models import CaptureSpec, LanguageModel, SamplingParams, load_pretrained

# Skips where the machine cannot build the kernels (no compiler, another platform), fails when the build fails.
needs_kernel = pytest.mark.usefixtures("cpu_kernels")

SHAPES = [(1, 576, 192), (3, 64, 1536), (8, 1536, 576), (13, 100, 33), (32, 576, 4000), (128, 48, 7), (5, 1, 32)]


def _data(m, k, n, seed=0):
  rng = np.random.default_rng(seed)
  return rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)


def test_pack_lays_columns_out_in_zero_padded_panels():
  w = np.arange(3 * 70, dtype=np.float32).reshape(3, 70)
  wp = np.asarray(kernels.pack(jnp.asarray(w)))
  assert wp.shape == (3, 3, kernels.PANEL)  # ceil(70 / 32) panels of [K, 32]
  for p in range(3):
    cols = w[:, p * 32 : (p + 1) * 32]
    np.testing.assert_array_equal(wp[p, :, : cols.shape[1]], cols)
    np.testing.assert_array_equal(wp[p, :, cols.shape[1] :], 0)


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_reference_on_packed_weights_is_the_plain_product(m, k, n):
  x, w = _data(m, k, n)
  y = kernels.reference_packed_matmul(jnp.asarray(x), kernels.pack(jnp.asarray(w)), n)
  np.testing.assert_allclose(np.asarray(y), x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_kernel_matches_a_float64_product_inside_jit(m, k, n):
  x, w = _data(m, k, n, seed=m + k + n)
  wp = kernels.pack(jnp.asarray(w))
  y = np.asarray(jax.jit(kernels.packed_matmul, static_argnums=2)(jnp.asarray(x), wp, n))
  ref = x.astype(np.float64) @ w
  assert y.shape == (m, n)
  assert np.abs(y - ref).max() <= 1e-5 * np.sqrt(k) * np.abs(ref).max()


@needs_kernel
def test_kernel_keeps_leading_axes_and_takes_no_rows():
  x, w = _data(6, 40, 50)
  wp = kernels.pack(jnp.asarray(w))
  y = kernels.packed_matmul(jnp.asarray(x.reshape(2, 3, 40)), wp, 50)
  np.testing.assert_allclose(np.asarray(y), (x @ w).reshape(2, 3, 50), rtol=1e-5, atol=1e-5)
  assert kernels.packed_matmul(jnp.zeros((0, 40)), wp, 50).shape == (0, 50)


@needs_kernel
def test_each_row_gives_the_same_bits_at_any_number_of_rows():
  """Batched and one-at-a-time decoding agree exactly: a row's sum order does not depend on the other rows."""
  x, w = _data(kernels.MAX_ROWS, 576, 200)
  wp = kernels.pack(jnp.asarray(w))
  full = np.asarray(kernels.packed_matmul(jnp.asarray(x), wp, 200))
  for lo, hi in [(0, 1), (5, 6), (0, 8), (3, 14), (100, 128)]:
    np.testing.assert_array_equal(np.asarray(kernels.packed_matmul(jnp.asarray(x[lo:hi]), wp, 200)), full[lo:hi])


@needs_kernel
def test_bad_shapes_dtypes_and_too_many_rows_are_refused():
  x, w = _data(2, 16, 40)
  wp = kernels.pack(jnp.asarray(w))
  with pytest.raises(ValueError, match="x \\[..., K\\] and wp"):
    kernels.packed_matmul(jnp.zeros((2, 17)), wp, 40)
  with pytest.raises(ValueError, match="n=70 does not match 2 panels"):
    kernels.packed_matmul(jnp.asarray(x), wp, 70)
  with pytest.raises(ValueError, match="float32 only"):
    kernels.packed_matmul(jnp.asarray(x, jnp.bfloat16), wp, 40)
  with pytest.raises(ValueError, match="at most MAX_ROWS"):
    kernels.packed_matmul(jnp.zeros((kernels.MAX_ROWS + 1, 16)), wp, 40)
  with pytest.raises(ValueError, match="a \\[K, N\\] weight expected"):
    kernels.pack(jnp.zeros((2, 3, 4)))


def test_build_off_by_environment_and_a_failed_compile_name_the_reason(tmp_path, monkeypatch):
  monkeypatch.setenv(build_lib.DISABLE_ENV, "0")
  off = build_lib.build("decode.cc", "ReprobePackedMatmul", "unused_target")
  assert off.target is None and build_lib.DISABLE_ENV in off.reason and off.cause == build_lib.OFF
  assert not off.failed  # turned off: a skip, not a failure
  monkeypatch.delenv(build_lib.DISABLE_ENV)
  if build_lib._compiler() is None:
    pytest.skip("no C++ compiler here")
  monkeypatch.setenv(build_lib.CACHE_ENV, str(tmp_path / "cache"))
  monkeypatch.setenv(build_lib.SOURCES_ENV, str(tmp_path))
  (tmp_path / "broken.cc").write_text("this is not C++;\n")
  res = build_lib.build("broken.cc", "Nothing", "unused_target")
  assert res.target is None and res.failed and "failed on" in res.reason and "broken.cc" in res.reason
  assert "error" in res.reason and "error" in res.log  # the compiler's own message
  assert not list((tmp_path / "cache").rglob("*.so"))  # nothing half-written left in the cache


# ------------------------------------------------------------------------------------------ the decode view


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
  return load_pretrained(tiny_llama_dir)


def test_small_models_keep_xla_dots_by_default(tiny):
  graph, params = tiny.decode_view()
  assert graph is tiny.static_graph and params is tiny.params
  assert tiny.decode_kernel.startswith("XLA dots (matmul weights under")


@needs_kernel
def test_decode_view_is_made_once_per_params_and_follows_replaced_params(tiny):
  lm = LanguageModel(tiny.config, tiny.graphdef, tiny.params, tiny.tokenizer)
  lm.packed_decode = True
  g1, p1 = lm.decode_view()
  assert lm.decode_kernel == "packed (CPU kernels)"
  assert lm.decode_view()[1] is p1
  lm.params = jax.tree.map(lambda a: a * 1.0, tiny.params)
  assert lm.decode_view()[1] is not p1
  lm.packed_decode = False
  assert lm.decode_view() == (lm.static_graph, lm.params) and lm.decode_kernel.startswith("XLA dots (off")


@needs_kernel
def test_a_model_sharing_the_weights_shares_the_packed_copies(tiny):
  lm = LanguageModel(tiny.config, tiny.graphdef, tiny.params, tiny.tokenizer)
  lm.packed_decode = True
  other = lm.sharing_weights(config=dataclasses.replace(tiny.config, eos_token_ids=()))
  assert other.config.eos_token_ids == () and other.tokenizer is tiny.tokenizer
  assert lm.sharing_weights(tokenizer=None).tokenizer is None
  assert other.decode_view()[1] is lm.decode_view()[1] and other.decode_kernel == "packed (CPU kernels)"
  other.packed_decode = False  # its own choice, not the first model's
  assert other.decode_view()[1] is other.params and lm.decode_kernel == "packed (CPU kernels)"


@needs_kernel
@pytest.mark.parametrize("rows", [1, 8, kernels.MAX_ROWS, kernels.MAX_ROWS + 1])
def test_fused_projections_equal_each_packed_product_bit_for_bit(rows):
  """q, k, v (with biases, as Qwen2's) through one packed call give each separate packed product exactly: every
  output column reads its own weight column only. Above MAX_ROWS each Linear runs XLA's dot on its own."""
  from flax import nnx
  from reprobe_jax.models.layers import Linear, PackedWeight, fused_matmul

  rngs = nnx.Rngs(0)
  lins = [Linear(64, n, ("embed", "heads"), bias=True, dtype=jnp.float32, rngs=rngs) for n in (96, 32, 32)]
  for i, lin in enumerate(lins):
    lin.bias[...] = jnp.full(lin.bias.shape, 0.1 * (i + 1), jnp.float32)
  x = jnp.asarray(np.random.default_rng(rows).standard_normal((rows, 64), dtype=np.float32))
  both = PackedWeight(kernels.pack(jnp.concatenate([lin.kernel[...] for lin in lins], axis=1)))
  fused = fused_matmul(x, lins, both)
  for lin, part in zip(lins, fused):
    if rows <= kernels.MAX_ROWS:
      alone = kernels.packed_matmul(x, kernels.pack(lin.kernel[...]), lin.kernel.shape[1]) + lin.bias[...]
    else:
      alone = lin(x)
    np.testing.assert_array_equal(np.asarray(part), np.asarray(alone))
  assert [p.shape[-1] for p in fused_matmul(x, lins, None)] == [96, 32, 32]


@needs_kernel
def test_decode_view_packs_qkv_and_gate_up_once(tiny):
  """The decode view holds q/k/v and gate/up side by side (one packed weight each), o, down and the head alone:
  as many packed bytes as the projection weights plus the panel padding, none of them twice."""
  lm = LanguageModel(tiny.config, tiny.graphdef, tiny.params, tiny.tokenizer)
  lm.packed_decode = True
  _, view = lm.decode_view()
  packed = {}
  for path, x in jax.tree_util.tree_leaves_with_path(view):
    keys = [str(getattr(k, "key", k)) for k in path]
    name = next((k for k in keys if k.startswith("packed")), None)
    if name is not None:
      packed.setdefault(name, []).append(x)
  layers = tiny.config.num_layers
  assert {k: len(v) for k, v in packed.items()} == {
    "packed_qkv": layers,
    "packed": 2 * layers,
    "packed_gate_up": layers,
    "packed_head": 1,
  }
  nbytes = sum(x.nbytes for xs in packed.values() for x in xs)
  weights = sum(
    x.nbytes
    for path, x in jax.tree_util.tree_leaves_with_path(tiny.params)
    if str(getattr(path[-2], "key", "")) in ("kernel", "lm_head")
  )
  if tiny.config.tie_word_embeddings:
    weights += tiny.params["embed_tokens"][...].nbytes
  assert weights <= nbytes < 1.25 * weights


@needs_kernel
def test_packed_decode_gives_the_same_tokens_and_features_as_xla_dots(tiny):
  """Greedy decode with capture through the kernel against the same decode through XLA's dots; and each prompt
  decoded alone (another padding bucket, so the rest of the step may round differently) gives the batch's tokens and
  log-probabilities."""
  cap = CaptureSpec(hidden_layers=(-1,), attn_window=3, top_k_probs=2, token_stats=True)
  prompts = [[1, 10, 11, 12, 13], [1, 20, 21], [1, 30, 31, 32, 33, 34, 35]]
  packed = LanguageModel(tiny.config, tiny.graphdef, tiny.params, tiny.tokenizer)
  packed.packed_decode = True
  greedy = SamplingParams(temperature=0)
  a = packed.generate(prompts, greedy, max_new_tokens=12, capture=cap)
  b = tiny.generate(prompts, greedy, max_new_tokens=12, capture=cap)
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-5)
  for name in a.features:
    np.testing.assert_allclose(np.asarray(a.features[name]), np.asarray(b.features[name]), atol=1e-5, err_msg=name)
  for i, p in enumerate(prompts):
    one = packed.generate([p], greedy, max_new_tokens=12)
    np.testing.assert_array_equal(np.asarray(one.tokens)[0], np.asarray(a.tokens)[i])
    np.testing.assert_allclose(np.asarray(one.logprobs)[0], np.asarray(a.logprobs)[i], atol=1e-5)


@needs_kernel
def test_packed_decode_of_rows_sharing_a_prompt_prefix_matches_xla(tiny):
  """n samples of a prompt read its cache as a shared prefix (the prefix attention products through the kernel):
  the same samples, with the same seed, as through XLA's dots."""
  cap = CaptureSpec(attn_window=3, token_stats=True)
  packed = LanguageModel(tiny.config, tiny.graphdef, tiny.params, tiny.tokenizer)
  packed.packed_decode = True
  prompts = [[1, 10, 11, 12, 13], [1, 20, 21]]
  warm = SamplingParams(temperature=0.7)
  a = packed.generate(prompts, warm, max_new_tokens=10, n=4, seed=3, capture=cap)
  b = tiny.generate(prompts, warm, max_new_tokens=10, n=4, seed=3, capture=cap)
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-5)
  np.testing.assert_allclose(np.asarray(a.features["attn_window"]), np.asarray(b.features["attn_window"]), atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("p,q,s,d", [(96, 3, 96, 64), (8, 48, 300, 64), (5, 2, 17, 80), (3, 1, 1, 8), (4, 5, 33, 130)])
def test_decode_attention_products_match_float64(p, q, s, d):
  from reprobe_jax.kernels import attention

  rng = np.random.default_rng(p + q + s + d)
  qs, ks = rng.standard_normal((p, q, d), dtype=np.float32), rng.standard_normal((p, s, d), dtype=np.float32)
  probs, vs = rng.random((p, q, s), dtype=np.float32), rng.standard_normal((p, s, d), dtype=np.float32)
  scores = np.asarray(jax.jit(attention.decode_qk)(jnp.asarray(qs), jnp.asarray(ks)))
  out = np.asarray(jax.jit(attention.decode_pv)(jnp.asarray(probs), jnp.asarray(vs)))
  np.testing.assert_allclose(scores, np.einsum("pqd,psd->pqs", qs.astype(np.float64), ks), atol=2e-5 * np.sqrt(d))
  np.testing.assert_allclose(out, np.einsum("pqs,psd->pqd", probs.astype(np.float64), vs), atol=2e-5 * np.sqrt(s))
  np.testing.assert_allclose(np.asarray(attention.reference_qk(jnp.asarray(qs), jnp.asarray(ks))), scores, atol=1e-4)
  np.testing.assert_allclose(np.asarray(attention.reference_pv(jnp.asarray(probs), jnp.asarray(vs))), out, atol=1e-4)
  # Leading dimensions are pairs too ([B, KV, S, D] as the cache is kept): the same products, bit for bit.
  if p % 3 == 0:
    split = lambda a: jnp.asarray(a).reshape(3, p // 3, *a.shape[1:])
    np.testing.assert_array_equal(
      np.asarray(jax.jit(attention.decode_qk)(split(qs), split(ks))).reshape(scores.shape), scores
    )
    np.testing.assert_array_equal(
      np.asarray(jax.jit(attention.decode_pv)(split(probs), split(vs))).reshape(out.shape), out
    )
    with pytest.raises(ValueError, match="same leading dimensions"):
      attention.decode_qk(split(qs), jnp.asarray(ks))
  with pytest.raises(ValueError, match="head sizes differ"):
    attention.decode_qk(jnp.asarray(qs), jnp.asarray(ks[..., :-1]))
  with pytest.raises(ValueError, match="probabilities per query"):
    attention.decode_pv(jnp.asarray(probs[..., :-1]), jnp.asarray(vs))
