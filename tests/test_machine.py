"""The machine description every reported number carries."""

from reprobe_jax.eval.machine import _cpuinfo, describe, isa_from_flags


def test_isa_is_the_widest_instruction_set_the_flags_name():
  assert isa_from_flags({"avx2", "avx512f", "amx_tile"}) == "AVX-512+AMX"
  assert isa_from_flags({"avx2", "avx512f"}) == "AVX-512"
  assert isa_from_flags({"sse4_2", "avx", "avx2", "fma"}) == "AVX2"  # an AMD EPYC without AVX-512
  assert isa_from_flags({"fp", "asimd"}) == "NEON"
  assert isa_from_flags(set()) == "unknown"


def test_cpuinfo_reads_the_first_model_name_and_flags(tmp_path):
  path = tmp_path / "cpuinfo"
  path.write_text(
    "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx avx2\n\n"
    "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n"
  )
  assert _cpuinfo(str(path)) == ("AMD EPYC 7B13", {"fpu", "avx", "avx2"})
  assert _cpuinfo(str(tmp_path / "missing")) == ("", set())


def test_describe_names_this_machine():
  m = describe()
  assert m.cpu and m.cores >= 1 and m.backend in ("cpu", "gpu", "tpu")
  assert m.isa in str(m)
