// plugins/cpu_onednn/steps/attention_test.cc — the fused attention (steps/attention.h) against straightforward
// double-precision loops: shapes around the tiles' edges, strided views as a chain passes them, masks, broadcast
// batches, teams, the scalar path, and nothing written outside the output.
#include "steps/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace keel::onednn {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

StridedView dense(const Dims& d) { return {d, dense_strides(d)}; }

std::string str(const Dims& d) {
  std::string s = "[";
  for (size_t k = 0; k < d.size(); ++k) s += (k ? "," : "") + std::to_string(d[k]);
  return s + "]";
}

// Runs the fast path (team threads; or the scalar path) and the reference into two copies of `y0` and compares
// every element of the output (|got - want| <= 2e-5 * max(1, max |want|) + 1e-4 |want|) and that nothing else of
// the buffer changed.
void check(const AttentionShape& s, const float* q, const float* kt, const float* v, const float* mask,
           const std::vector<float>& y0, int team, bool scalar, const std::string& what) {
  std::vector<float> got = y0, want = y0;
  const size_t per = attention_scratch_floats(s);
  std::vector<float> scratch(per * static_cast<size_t>(std::max(team, 1)), std::nanf(""));
  if (scalar) attention_tasks_scalar(s, q, kt, v, mask, got.data(), 0, s.tasks(), scratch.data());
  else attention_run(s, q, kt, v, mask, got.data(), scratch.data(), team);
  attention_reference(s, q, kt, v, mask, want.data());
  double top = 0;
  for (float w : want) top = std::max(top, std::fabs(static_cast<double>(w)));
  for (size_t k = 0; k < got.size(); ++k) {
    if (want[k] == y0[k] && got[k] == y0[k]) continue;  // untouched (outside the output, or equal by chance)
    const double tol = 2e-5 * std::max(1.0, top) + 1e-4 * std::fabs(want[k]);
    ASSERT_LE(std::fabs(got[k] - want[k]), tol) << what << ": element " << k << " got " << got[k] << ", want "
                                                << want[k] << " (team " << team << (scalar ? ", scalar" : "") << ")";
  }
}

// Dense Q [H,S,D], Kt [H,D,T], V [H,T,Dv] (the standalone kernel's case), teams 1 and 2, and the scalar path.
TEST(OnednnAttention, DenseShapesAgainstTheReference) {
  struct C {
    int64_t H, S, T, D, Dv;
  };
  const C cases[] = {{1, 1, 1, 32, 32},  {1, 7, 7, 64, 64},     {4, 128, 128, 64, 64}, {2, 197, 197, 64, 64},
                     {16, 7, 7, 32, 32}, {3, 128, 128, 80, 80}, {1, 1, 197, 64, 64},   {2, 7, 33, 80, 80},
                     {1, 13, 17, 1, 5},  {5, 9, 250, 16, 100},  {1, 50, 3, 7, 129}};
  uint32_t seed = 1;
  for (const C& c : cases) {
    const Dims qd{c.H, c.S, c.D}, kd{c.H, c.D, c.T}, vd{c.H, c.T, c.Dv};
    Dims out;
    std::string why;
    ASSERT_TRUE(attention_out_dims(qd, kd, vd, nullptr, &out, &why)) << why;
    ASSERT_EQ(out, (Dims{c.H, c.S, c.Dv}));
    const auto q = random_floats(static_cast<size_t>(c.H * c.S * c.D), seed++, -2.f, 2.f);
    const auto k = random_floats(static_cast<size_t>(c.H * c.D * c.T), seed++, -2.f, 2.f);
    const auto v = random_floats(static_cast<size_t>(c.H * c.T * c.Dv), seed++);
    const std::vector<float> y0(static_cast<size_t>(c.H * c.S * c.Dv), 0.f);
    const std::string what = "H=" + std::to_string(c.H) + " S=" + std::to_string(c.S) + " T=" + std::to_string(c.T) +
                             " D=" + std::to_string(c.D) + " Dv=" + std::to_string(c.Dv);
    for (int team : {1, 2, 3}) {
      const AttentionShape s =
          attention_plan(dense(qd), dense(kd), dense(vd), nullptr, dense(out), 1.f / std::sqrt(float(c.D)), team);
      check(s, q.data(), k.data(), v.data(), nullptr, y0, team, false, what);
      if (team == 1) check(s, q.data(), k.data(), v.data(), nullptr, y0, 1, true, what);
    }
  }
}

// As a claimed chain reads them: Q, K, V slices of one in-projection output [S, 1, 3*H*Dh] (Reshape [S,H,Dh] and
// Transpose views: Kt's columns 3*H*Dh apart, so it is packed), Y written transposed ([H,S,Dh] into [S,H,Dh]
// memory) inside a bigger buffer whose other elements must stay.
TEST(OnednnAttention, StridedViewsOfOneProjection) {
  for (int64_t H : {1, 4, 12, 16})
    for (int64_t Dh : {32, 64, 80})
      for (int64_t S : {1, 7, 128, 197}) {
        if (H * S * Dh > 16 * 128 * 64) continue;  // keeps the double-precision reference quick
        const int64_t E = H * Dh, row = 3 * E;
        const auto qkv = random_floats(static_cast<size_t>(S * row), static_cast<uint32_t>(H * 1000 + Dh * 10 + S));
        const StridedView q{{H, S, Dh}, {Dh, row, 1}};
        const StridedView kt{{H, Dh, S}, {Dh, 1, row}};
        const StridedView v{{H, S, Dh}, {Dh, row, 1}};
        const StridedView y{{H, S, Dh}, {Dh, E, 1}};
        std::vector<float> y0(static_cast<size_t>(S * E + 37), 7.f);
        const std::string what = "H=" + std::to_string(H) + " Dh=" + std::to_string(Dh) + " S=" + std::to_string(S);
        for (int team : {1, 2}) {
          const AttentionShape s = attention_plan(q, kt, v, nullptr, y, 0.125f, team);
          if (S > 1) {
            EXPECT_EQ(s.k_col, row) << what;  // (one column reads as contiguous)
          }
          check(s, qkv.data(), qkv.data() + E, qkv.data() + 2 * E, nullptr, y0, team, false, what);
        }
        const AttentionShape s = attention_plan(q, kt, v, nullptr, y, 0.125f, 1);
        check(s, qkv.data(), qkv.data() + E, qkv.data() + 2 * E, nullptr, y0, 1, true, what);
      }
}

// As a claimed chain reads a batched packed in-projection [S, B, 3*H*Dh] split into heads (shape.cc's atom views):
// batch entries (b, h) with their own offsets, Q's and V's rows B*3*H*Dh apart (pages apart for B > 1: Q's row
// blocks and V are packed per task), Y written transposed into [S, B, H, Dh] memory.
TEST(OnednnAttention, BatchedHeadsOfOneProjection) {
  for (int64_t B : {1, 2, 3, 8})
    for (int64_t H : {1, 4})
      for (int64_t S : {7, 64, 130}) {
        const int64_t Dh = 32, E = H * Dh, row = B * 3 * E;
        const auto qkv = random_floats(static_cast<size_t>(S * row), static_cast<uint32_t>(B * 1000 + H * 10 + S));
        const StridedView q{{B, H, S, Dh}, {3 * E, Dh, row, 1}};
        const StridedView kt{{B, H, Dh, S}, {3 * E, Dh, 1, row}};
        const StridedView v{{B, H, S, Dh}, {3 * E, Dh, row, 1}};
        const StridedView y{{B, H, S, Dh}, {E, Dh, B * E, 1}};
        std::vector<float> y0(static_cast<size_t>(S * B * E + 29), 7.f);
        const std::string what = "B=" + std::to_string(B) + " H=" + std::to_string(H) + " S=" + std::to_string(S);
        for (int team : {1, 2}) {
          const AttentionShape s = attention_plan(q, kt, v, nullptr, y, 0.17f, team);
          check(s, qkv.data(), qkv.data() + E, qkv.data() + 2 * E, nullptr, y0, team, false, what);
        }
        const AttentionShape s = attention_plan(q, kt, v, nullptr, y, 0.17f, 1);
        check(s, qkv.data(), qkv.data() + E, qkv.data() + 2 * E, nullptr, y0, 1, true, what);
      }
}

// Additive masks of every broadcast form, with -inf entries and one row masked entirely (which gives 0), and batch
// dimensions that broadcast (Q [2,1,S,D] against Kt [1,3,D,T], V [3,T,Dv]).
TEST(OnednnAttention, MasksAndBroadcastBatches) {
  const int64_t B = 2, H = 3, S = 7, T = 19, D = 24, Dv = 40;
  const Dims qd{B, 1, S, D}, kd{1, H, D, T}, vd{H, T, Dv};
  const auto q = random_floats(static_cast<size_t>(B * S * D), 11, -2.f, 2.f);
  const auto k = random_floats(static_cast<size_t>(H * D * T), 12, -2.f, 2.f);
  const auto v = random_floats(static_cast<size_t>(H * T * Dv), 13);
  const float inf = std::numeric_limits<float>::infinity();
  for (const Dims& md : {Dims{T}, Dims{S, T}, Dims{B, 1, 1, T}, Dims{B, H, S, T}, Dims{1}, Dims{S, 1}, Dims{}}) {
    auto mask = random_floats(static_cast<size_t>(std::max<int64_t>(1,
                                                                    [&] {
                                                                      int64_t n = 1;
                                                                      for (int64_t d : md) n *= d;
                                                                      return n;
                                                                    }())),
                              14, -3.f, 3.f);
    // Key padding: -inf at every 5th entry; where the mask holds whole rows, one row -inf everywhere.
    for (size_t i = 0; i < mask.size(); i += 5) mask[i] = -inf;
    if (md.size() >= 2 && md.back() == T)
      for (int64_t t = 0; t < T; ++t) mask[static_cast<size_t>(T + t)] = -inf;  // row 1 of the first [S,T] slab
    Dims out;
    std::string why;
    ASSERT_TRUE(attention_out_dims(qd, kd, vd, &md, &out, &why)) << str(md) << ": " << why;
    ASSERT_EQ(out, (Dims{B, H, S, Dv}));
    const StridedView mv = dense(md);
    const std::vector<float> y0(static_cast<size_t>(B * H * S * Dv), -5.f);
    for (int team : {1, 2}) {
      const AttentionShape s = attention_plan(dense(qd), dense(kd), dense(vd), &mv, dense(out), 0.3f, team);
      check(s, q.data(), k.data(), v.data(), mask.data(), y0, team, false, "mask " + str(md));
      if (team == 1) check(s, q.data(), k.data(), v.data(), mask.data(), y0, 1, true, "mask " + str(md));
    }
  }
}

// The row masked entirely gives exactly 0 (as the reference kernel of ops/reference/fused.cc).
TEST(OnednnAttention, FullyMaskedRowIsZero) {
  const int64_t S = 3, T = 20, D = 16;
  const auto q = random_floats(static_cast<size_t>(S * D), 21), k = random_floats(static_cast<size_t>(D * T), 22),
             v = random_floats(static_cast<size_t>(T * D), 23);
  std::vector<float> mask(static_cast<size_t>(S * T), 0.f);
  for (int64_t t = 0; t < T; ++t) mask[static_cast<size_t>(T + t)] = -std::numeric_limits<float>::infinity();
  const StridedView mv = dense({S, T});
  const AttentionShape s = attention_plan(dense({S, D}), dense({D, T}), dense({T, D}), &mv, dense({S, D}), 1.f, 1);
  std::vector<float> y(static_cast<size_t>(S * D), 9.f), scratch(attention_scratch_floats(s));
  attention_run(s, q.data(), k.data(), v.data(), mask.data(), y.data(), scratch.data(), 1);
  for (int64_t e = 0; e < D; ++e) EXPECT_EQ(y[static_cast<size_t>(D + e)], 0.f) << e;
  for (int64_t e = 0; e < D; ++e) EXPECT_NE(y[static_cast<size_t>(e)], 9.f) << e;
}

// A team splits tasks, never a task: every team size gives the same bits.
TEST(OnednnAttention, TeamsGiveIdenticalResults) {
  const Dims qd{4, 128, 64}, kd{4, 64, 128}, vd{4, 128, 64}, od{4, 128, 64};
  const auto q = random_floats(4 * 128 * 64, 31), k = random_floats(4 * 64 * 128, 32),
             v = random_floats(4 * 128 * 64, 33);
  const AttentionShape s = attention_plan(dense(qd), dense(kd), dense(vd), nullptr, dense(od), 0.125f, 4);
  std::vector<float> first;
  for (int team : {1, 2, 3, 4}) {
    std::vector<float> y(4 * 128 * 64), scratch(attention_scratch_floats(s) * 4);
    attention_run(s, q.data(), k.data(), v.data(), nullptr, y.data(), scratch.data(), team);
    if (first.empty()) first = y;
    else ASSERT_EQ(y, first) << "team " << team;
  }
}

// A reshape that no single view expresses, as the atoms both shapes are made of: every element of `to` found where
// the source has it.
TEST(OnednnAttention, ReshapeAtomsOfStridedViews) {
  Dims atoms, st;
  std::vector<Dims> groups;
  // torch's packed in-projection at batch 8: the q slice [S, B, 256] of [S, B, 768], heads of 32 merged with the batch.
  ASSERT_TRUE(reshape_atoms({128, 8, 256}, {6144, 768, 1}, {128, 64, 32}, &atoms, &st, &groups));
  EXPECT_EQ(atoms, (Dims{128, 8, 8, 32}));
  EXPECT_EQ(st, (Dims{6144, 768, 32, 1}));
  EXPECT_EQ(groups, (std::vector<Dims>{{0}, {1, 2}, {3}}));
  EXPECT_FALSE(reshape_atoms({6, 4}, {4, 1}, {4, 6}, &atoms, &st, &groups));  // 4 cuts the 6 unevenly
  EXPECT_FALSE(reshape_atoms({2, 3}, {3, 1}, {7}, &atoms, &st, &groups));
  EXPECT_FALSE(reshape_atoms({2, 1, 3}, {3, 3, 1}, {6}, &atoms, &st, &groups));  // dims of 1: reshape_strides'
  // Random shapes: split a random view's dims into random factors and merge neighbours of them again.
  std::mt19937 rng(7);
  for (int c = 0; c < 300; ++c) {
    Dims parts;
    for (int k = 0, n = 2 + static_cast<int>(rng() % 4); k < n; ++k)
      parts.push_back(2 + static_cast<int64_t>(rng() % 3));
    auto merge = [&](Dims* out) {
      out->clear();
      for (size_t k = 0; k < parts.size(); ++k)
        if (out->empty() || rng() % 2) out->push_back(parts[k]);
        else out->back() *= parts[k];
    };
    Dims from, to;
    merge(&from), merge(&to);
    Dims fs(from.size());  // a strided source: each dim padded to a larger extent
    int64_t extent = 1;
    for (size_t k = from.size(); k-- > 0;) fs[k] = extent, extent *= from[k] + static_cast<int64_t>(rng() % 3);
    ASSERT_TRUE(reshape_atoms(from, fs, to, &atoms, &st, &groups));
    int64_t total = 1;
    for (int64_t d : to) total *= d;
    for (int64_t e = 0; e < total; ++e) {
      // Element e of `to` (row-major) is element e of `from` (row-major): both offsets must agree.
      int64_t rest = e, want = 0, got = 0;
      for (size_t k = from.size(); k-- > 0;) want += (rest % from[k]) * fs[k], rest /= from[k];
      rest = e;
      for (size_t k = to.size(); k-- > 0;) {
        int64_t idx = rest % to[k];
        rest /= to[k];
        for (size_t g = groups[k].size(); g-- > 0;) {
          const auto a = static_cast<size_t>(groups[k][g]);
          got += (idx % atoms[a]) * st[a], idx /= atoms[a];
        }
      }
      ASSERT_EQ(got, want) << "case " << c << " element " << e;
    }
  }
}

// A strided view reshaped without moving data (the chains' Reshape of a q/k/v slice), and the cases that need a
// copy.
TEST(OnednnAttention, ReshapeOfStridedViews) {
  Dims st;
  ASSERT_TRUE(reshape_strides({128, 1, 256}, {768, 768, 1}, {128, 4, 64}, &st));
  EXPECT_EQ(st, (Dims{768, 64, 1}));
  ASSERT_TRUE(reshape_strides({2, 3, 4}, {12, 4, 1}, {6, 4}, &st));  // dense: merges
  EXPECT_EQ(st, (Dims{4, 1}));
  ASSERT_TRUE(reshape_strides({4, 8}, {16, 1}, {4, 1, 2, 4, 1}, &st));  // a row slice, split, dims of 1 added
  EXPECT_EQ(st, (Dims{16, 8, 4, 1, 1}));
  ASSERT_TRUE(reshape_strides({197, 768}, {2304, 1}, {197, 12, 64}, &st));
  EXPECT_EQ(st, (Dims{2304, 64, 1}));
  EXPECT_FALSE(reshape_strides({128, 256}, {768, 1}, {256, 128}, &st));  // would merge non-contiguous rows
  EXPECT_FALSE(reshape_strides({4, 64}, {1, 4}, {256}, &st));            // a transposed view flattened
  EXPECT_FALSE(reshape_strides({2, 3}, {3, 1}, {7}, &st));               // element counts differ
  EXPECT_FALSE(reshape_strides({0, 3}, {3, 1}, {3, 0}, &st));
  // Every element of a successful view lands where the source has it.
  const Dims from{3, 1, 10}, fs{40, 40, 2}, to{3, 2, 5};
  ASSERT_TRUE(reshape_strides(from, fs, to, &st));
  for (int64_t a = 0; a < 3; ++a)
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t c = 0; c < 5; ++c) EXPECT_EQ(a * st[0] + b * st[1] + c * st[2], a * 40 + (b * 5 + c) * 2);
}

TEST(OnednnAttention, ShapeErrorsAreNamed) {
  Dims out;
  std::string why;
  EXPECT_FALSE(attention_out_dims({4, 8}, {8}, {8, 4}, nullptr, &out, &why));
  EXPECT_NE(why.find("rank >= 2"), std::string::npos) << why;
  EXPECT_FALSE(attention_out_dims({2, 5, 8}, {2, 7, 5}, {2, 5, 4}, nullptr, &out, &why));
  EXPECT_NE(why.find("inner dimensions"), std::string::npos) << why;
  EXPECT_FALSE(attention_out_dims({2, 5, 8}, {2, 8, 5}, {2, 6, 4}, nullptr, &out, &why));
  EXPECT_NE(why.find("rows"), std::string::npos) << why;
  EXPECT_FALSE(attention_out_dims({2, 5, 8}, {3, 8, 5}, {5, 4}, nullptr, &out, &why));
  EXPECT_NE(why.find("do not broadcast"), std::string::npos) << why;
  EXPECT_FALSE(attention_out_dims({5, 8}, {8, 5}, {3, 5, 4}, nullptr, &out, &why));
  EXPECT_NE(why.find("V "), std::string::npos) << why;
  const Dims bad{2, 5, 5};
  EXPECT_FALSE(attention_out_dims({5, 8}, {8, 5}, {5, 4}, &bad, &out, &why));
  EXPECT_NE(why.find("mask"), std::string::npos) << why;
  const Dims ok{1, 5};
  EXPECT_TRUE(attention_out_dims({5, 8}, {8, 5}, {5, 4}, &ok, &out, &why)) << why;
  EXPECT_EQ(out, (Dims{5, 4}));
}

}  // namespace
}  // namespace keel::onednn
