// Reference kernel TfIdfVectorizer (9): n-gram counting over integer token ids (pool_int64s). String inputs
// (pool_strings) are not handled: the runtime has no string tensors.
#include <map>

#include "ops/reference/kernels.h"

namespace keel::ops::ref {

void op_tfidf_vectorizer(Kctx& k) {
  TView x = k.in(0);
  if (x.ndim() != 1 && x.ndim() != 2) k.invalid(cat("input must be [C] or [N, C], got ", shape_str(x.shape)));
  if (k.attr_strings("pool_strings")) k.unimpl("string pools (pool_strings) are not handled");
  auto pool = k.attr_ints("pool_int64s");
  if (!pool) k.invalid("attribute pool_int64s is required");
  const int64_t min_n = k.attr_i("min_gram_length", 1), max_n = k.attr_i("max_gram_length", 1);
  const int64_t max_skip = k.attr_i("max_skip_count", 0);
  if (min_n < 1 || max_n < min_n) k.invalid(cat("bad n-gram lengths min ", min_n, " max ", max_n));
  if (max_skip < 0) k.invalid("max_skip_count must be >= 0");
  std::string mode = k.attr_s("mode", "");
  int imode;
  if (mode == "TF") imode = 0;
  else if (mode == "IDF") imode = 1;
  else if (mode == "TFIDF") imode = 2;
  else k.invalid(cat("mode must be TF, IDF or TFIDF, got '", mode, "'"));
  auto counts = k.attr_ints_or("ngram_counts", {});
  auto indexes = k.attr_ints_or("ngram_indexes", {});
  auto weights = k.attr_floats("weights");

  // Map every n-gram of the pool to its output column. counts[i] is where the (i+1)-grams start in the pool.
  std::map<std::vector<int64_t>, int64_t> table;
  const int64_t P = static_cast<int64_t>(pool->size());
  int64_t ordinal = 0, out_len = 0;
  for (int64_t idx : indexes) out_len = std::max(out_len, idx + 1);
  for (size_t level = 0; level < counts.size(); ++level) {
    const int64_t n = static_cast<int64_t>(level) + 1;
    int64_t begin = counts[level], end = level + 1 < counts.size() ? counts[level + 1] : P;
    if (begin < 0 || end > P || begin > end) k.invalid("ngram_counts does not fit the pool");
    if ((end - begin) % n != 0) k.invalid(cat("the ", n, "-gram section of the pool is not a multiple of ", n));
    for (int64_t s = begin; s < end; s += n, ++ordinal) {
      if (ordinal >= static_cast<int64_t>(indexes.size())) k.invalid("ngram_indexes has fewer entries than the pool");
      int64_t col = indexes[ordinal];
      if (col < 0) k.invalid("ngram_indexes must be >= 0");
      if (n >= min_n && n <= max_n) table.emplace(std::vector<int64_t>(pool->begin() + s, pool->begin() + s + n), col);
    }
  }
  if (weights && static_cast<int64_t>(weights->size()) < out_len) k.invalid("weights has fewer entries than outputs");

  const bool batched = x.ndim() == 2;
  const int64_t rows = batched ? x.shape[0] : 1, C = batched ? x.shape[1] : x.shape[0];
  Shape os = batched ? Shape{rows, out_len} : Shape{out_len};
  TView y = k.out(0, os);
  std::vector<int64_t> tok = read_ints(x, k, "input");
  std::vector<double> freq(static_cast<size_t>(out_len));
  std::vector<int64_t> gram;
  dispatch(
      FloatTs{}, y.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t r = 0; r < rows; ++r) {
          std::fill(freq.begin(), freq.end(), 0.0);
          const int64_t* t = tok.data() + r * C;
          for (int64_t i = 0; i < C; ++i)
            for (int64_t n = min_n; n <= max_n; ++n) {
              // Unigrams are counted once per position; longer grams once per skip distance.
              for (int64_t skip = 0; skip <= (n == 1 ? 0 : max_skip); ++skip) {
                if (i + (n - 1) * (skip + 1) >= C) break;
                gram.clear();
                for (int64_t j = 0; j < n; ++j) gram.push_back(t[i + j * (skip + 1)]);
                auto it = table.find(gram);
                if (it != table.end()) freq[it->second] += 1;
              }
            }
          T* out = y.p<T>() + r * out_len;
          for (int64_t c = 0; c < out_len; ++c) {
            double w = weights ? (*weights)[c] : 1.0, v = freq[c];
            if (imode == 1) v = v > 0 ? w : 0;
            else if (imode == 2) v = v * w;
            out[c] = st<T>(v);
          }
        }
      },
      "output");
}

}  // namespace keel::ops::ref
