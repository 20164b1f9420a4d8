// The CPU decode path's kernels, registered with XLA's FFI: a small-M matmul over packed weights (below) and the
// two products of decode attention (further down).
//
// y[M, N] = x[M, K] @ w[K, N] for small M, with w stored packed: wp[P, K, 32], P = ceil(N / 32), panel p holding
// columns [32p, 32p + 32) of w row after row (zero past N). Each panel is one contiguous stream, read once from
// memory per call whatever M is (rows are done 8 at a time over the panel while it sits in L2), so a decode step
// reads every weight at close to the machine's streaming rate at batch 1 and stays near it up to batch 8-16, where
// XLA:CPU's dots re-pack the weight on every call. Panels are shared out over XLA's intra-op thread pool.
//
// Row m of y depends on row m of x only, summed in one fixed order (k ascending, one lane per column): the same
// row gives the same bits at any M, so batched and one-at-a-time decoding agree exactly.
//
// Built at first use by reprobe_jax/kernels/build.py (g++ -O3 -march=native); vector code from GCC's generic
// vector extension, so the same source compiles to AVX-512, AVX2 or NEON.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v16 __attribute__((vector_size(64)));
constexpr int64_t kPanel = 32;  // columns per panel: two 16-float vectors
constexpr int64_t kRows = 8;    // rows of x per register block: 16 accumulators

inline v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Rows [m0, m0 + mr) of x against one panel; writes the panel's `cols` valid columns of those rows of y.
template <int MR>
inline void block(const float* x, const float* panel, float* y, int64_t k_dim, int64_t n_dim, int64_t m0,
                  int64_t cols) {
  v16 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = v16{};
  const float* w = panel;
  const float* xr = x + m0 * k_dim;
  for (int64_t k = 0; k < k_dim; ++k, w += kPanel) {
    const v16 w0 = load16(w), w1 = load16(w + 16);
    for (int i = 0; i < MR; ++i) {
      const float a = xr[i * k_dim + k];
      acc[i][0] += a * w0;
      acc[i][1] += a * w1;
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* out = y + (m0 + i) * n_dim;
    if (cols == kPanel) {
      std::memcpy(out, &acc[i][0], sizeof(v16));
      std::memcpy(out + 16, &acc[i][1], sizeof(v16));
    } else {
      float tmp[kPanel];
      std::memcpy(tmp, &acc[i][0], sizeof(v16));
      std::memcpy(tmp + 16, &acc[i][1], sizeof(v16));
      std::memcpy(out, tmp, cols * sizeof(float));
    }
  }
}

void panel_rows(const float* x, const float* panel, float* y, int64_t m_dim, int64_t k_dim, int64_t n_dim,
                int64_t cols) {
  int64_t m0 = 0;
  for (; m0 + kRows <= m_dim; m0 += kRows) block<kRows>(x, panel, y, k_dim, n_dim, m0, cols);
  switch (m_dim - m0) {
    case 7: block<7>(x, panel, y, k_dim, n_dim, m0, cols); break;
    case 6: block<6>(x, panel, y, k_dim, n_dim, m0, cols); break;
    case 5: block<5>(x, panel, y, k_dim, n_dim, m0, cols); break;
    case 4: block<4>(x, panel, y, k_dim, n_dim, m0, cols); break;
    case 3: block<3>(x, panel, y, k_dim, n_dim, m0, cols); break;
    case 2: block<2>(x, panel, y, k_dim, n_dim, m0, cols); break;
    case 1: block<1>(x, panel, y, k_dim, n_dim, m0, cols); break;
    default: break;
  }
}

// Runs fn(i) for i in [0, items) on XLA's intra-op pool and the calling thread: chunks of items are claimed from
// one counter, about four per thread (small enough to even out, large enough that each is a long stream). The
// caller claims chunks too, so the call finishes even if no pool thread ever runs a task (a pool of one, or busy
// threads); a task that starts late finds nothing left, and holds the shared state, so it never touches freed memory.
template <typename F>
void parallel_for(ffi::ThreadPool& pool, int64_t items, F fn) {
  struct Shared {
    F fn;
    int64_t items, chunk, chunks;
    std::atomic<int64_t> next{0}, done{0};
    explicit Shared(F f) : fn(std::move(f)) {}
    void run() {
      for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
           c = next.fetch_add(1, std::memory_order_relaxed)) {
        for (int64_t i = c * chunk; i < std::min(items, (c + 1) * chunk); ++i) fn(i);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto sh = std::make_shared<Shared>(std::move(fn));
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  sh->items = items;
  sh->chunk = std::max<int64_t>(1, items / (4 * threads));
  sh->chunks = (items + sh->chunk - 1) / sh->chunk;
  const int64_t helpers = std::min<int64_t>(threads, sh->chunks) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([sh] { sh->run(); });
  sh->run();
  while (sh->done.load(std::memory_order_acquire) < sh->chunks) std::this_thread::yield();
}

ffi::Error PackedMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> wp,
                            ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = wp.dimensions();
  const auto yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2) {
    return ffi::Error::InvalidArgument("packed_matmul: x [M, K], wp [P, K, 32] and y [M, N] expected");
  }
  const int64_t m = xd[0], k = xd[1], panels = wd[0], n = yd[1];
  if (wd[1] != k || wd[2] != kPanel || yd[0] != m || n > panels * kPanel || n <= (panels - 1) * kPanel) {
    return ffi::Error::InvalidArgument("packed_matmul: shapes do not match (x [M, K], wp [ceil(N/32), K, 32])");
  }
  if (m == 0 || n == 0) return ffi::Error::Success();
  const float* xp = x.typed_data();
  const float* wpp = wp.typed_data();
  float* yp = y->typed_data();
  parallel_for(pool, panels, [=](int64_t p) {
    panel_rows(xp, wpp + p * k * kPanel, yp + p * kPanel, m, k, n, std::min(kPanel, n - p * kPanel));
  });
  return ffi::Error::Success();
}

// ------------------------------------------------------------------------------------------ decode attention
// The two products of attention for a few queries against a KV cache, per (row, KV head) pair bt:
//   scores[bt, q, s] = sum_d q[bt, q, d] * k[bt, s, d]       (QK: each key row read once for all of bt's queries)
//   out[bt, q, d]    = sum_s p[bt, q, s] * v[bt, s, d]       (PV: each value row read once likewise)
// XLA:CPU runs these as B * KV tiny batched GEMMs and read a SmolLM2 batch-32 cache at about 10 GB/s; here each
// pair's keys and values are one contiguous stream. Pairs are shared out over the pool as the panels are.

typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

inline float hsum(v16 v) {  // a fixed tree: halves, then quarters, then the last four
  const v8 h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4 q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
  return (q[0] + q[2]) + (q[1] + q[3]);
}

void qk_pair(const float* q, const float* k, float* out, int64_t nq, int64_t s_dim, int64_t d) {
  const int64_t dv = d / 16 * 16;
  for (int64_t s = 0; s < s_dim; ++s) {
    const float* kr = k + s * d;
    for (int64_t i = 0; i < nq; ++i) {
      const float* qr = q + i * d;
      v16 acc{};
      for (int64_t j = 0; j < dv; j += 16) acc += load16(qr + j) * load16(kr + j);
      float a = hsum(acc);
      for (int64_t j = dv; j < d; ++j) a += qr[j] * kr[j];
      out[i * s_dim + s] = a;
    }
  }
}

constexpr int64_t kPvRows = 4, kPvVecs = 4;  // a 4 x 64 block of the output in 16 accumulators

void pv_pair(const float* p, const float* v, float* out, int64_t nq, int64_t s_dim, int64_t d) {
  const int64_t dv = d / 16 * 16;
  for (int64_t i0 = 0; i0 < nq; i0 += kPvRows) {
    const int64_t ni = std::min(kPvRows, nq - i0);
    for (int64_t j0 = 0; j0 < dv; j0 += 16 * kPvVecs) {
      const int64_t nj = std::min<int64_t>(kPvVecs, (dv - j0) / 16);
      v16 acc[kPvRows][kPvVecs] = {};
      for (int64_t s = 0; s < s_dim; ++s) {
        const float* vr = v + s * d + j0;
        v16 vv[kPvVecs];
        for (int64_t j = 0; j < nj; ++j) vv[j] = load16(vr + 16 * j);
        for (int64_t i = 0; i < ni; ++i) {
          const float a = p[(i0 + i) * s_dim + s];
          for (int64_t j = 0; j < nj; ++j) acc[i][j] += a * vv[j];
        }
      }
      for (int64_t i = 0; i < ni; ++i)
        for (int64_t j = 0; j < nj; ++j) std::memcpy(out + (i0 + i) * d + j0 + 16 * j, &acc[i][j], sizeof(v16));
    }
    for (int64_t j = dv; j < d; ++j)  // a head size not a multiple of 16: the rest one column at a time
      for (int64_t i = 0; i < ni; ++i) {
        float a = 0.f;
        for (int64_t s = 0; s < s_dim; ++s) a += p[(i0 + i) * s_dim + s] * v[s * d + j];
        out[(i0 + i) * d + j] = a;
      }
  }
}

// The pairs of a decode-attention operand: the product of every dimension but the last two (so [B, KV, S, D] is
// read as B * KV pairs without a reshape in XLA, which would make it duplicate the cache write into a second
// fusion). -1 where `a` has fewer than 3 dimensions or its leading dimensions differ from `b`'s.
template <typename DimsA, typename DimsB>
int64_t leading_pairs(const DimsA& a, const DimsB& b) {
  if (a.size() < 3 || a.size() != b.size()) return -1;
  int64_t pairs = 1;
  for (size_t i = 0; i + 2 < a.size(); ++i) {
    if (a[i] != b[i]) return -1;
    pairs *= a[i];
  }
  return pairs;
}

ffi::Error QkImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                  ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), kd = k.dimensions(), od = out->dimensions();
  const int64_t pairs = leading_pairs(qd, kd), n = qd.size();
  if (pairs < 0 || leading_pairs(qd, od) != pairs || kd[n - 1] != qd[n - 1] || od[n - 2] != qd[n - 2] ||
      od[n - 1] != kd[n - 2]) {
    return ffi::Error::InvalidArgument("decode_qk: q [..., Q, D], k [..., S, D] -> [..., Q, S] expected");
  }
  const int64_t nq = qd[n - 2], d = qd[n - 1], s_dim = kd[n - 2];
  const float *qp = q.typed_data(), *kp = k.typed_data();
  float* op = out->typed_data();
  if (pairs == 0 || nq == 0 || s_dim == 0) return ffi::Error::Success();
  parallel_for(pool, pairs, [=](int64_t b) {
    qk_pair(qp + b * nq * d, kp + b * s_dim * d, op + b * nq * s_dim, nq, s_dim, d);
  });
  return ffi::Error::Success();
}

ffi::Error PvImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> p, ffi::Buffer<ffi::F32> v,
                  ffi::ResultBuffer<ffi::F32> out) {
  const auto pd = p.dimensions(), vd = v.dimensions(), od = out->dimensions();
  const int64_t pairs = leading_pairs(pd, vd), n = pd.size();
  if (pairs < 0 || leading_pairs(pd, od) != pairs || vd[n - 2] != pd[n - 1] || od[n - 2] != pd[n - 2] ||
      od[n - 1] != vd[n - 1]) {
    return ffi::Error::InvalidArgument("decode_pv: p [..., Q, S], v [..., S, D] -> [..., Q, D] expected");
  }
  const int64_t nq = pd[n - 2], s_dim = pd[n - 1], d = vd[n - 1];
  const float *pp = p.typed_data(), *vp = v.typed_data();
  float* op = out->typed_data();
  if (pairs == 0 || nq == 0 || d == 0) return ffi::Error::Success();
  if (s_dim == 0) {
    std::memset(op, 0, sizeof(float) * pairs * nq * d);
    return ffi::Error::Success();
  }
  parallel_for(pool, pairs, [=](int64_t b) {
    pv_pair(pp + b * nq * s_dim, vp + b * s_dim * d, op + b * nq * d, nq, s_dim, d);
  });
  return ffi::Error::Success();
}

// Every kernel here takes XLA's intra-op pool, two float32 operands and one float32 result.
auto TwoInOneOut() {
  return ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>().Ret<
      ffi::Buffer<ffi::F32>>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ReprobePackedMatmul, PackedMatmulImpl, TwoInOneOut());
XLA_FFI_DEFINE_HANDLER_SYMBOL(ReprobeDecodeQk, QkImpl, TwoInOneOut());
XLA_FFI_DEFINE_HANDLER_SYMBOL(ReprobeDecodePv, PvImpl, TwoInOneOut());
