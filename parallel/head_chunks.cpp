#include "parallel/head_chunks.h"

namespace ulysses {

bool heads_fit_ulysses(int n_heads, int n_kv_heads, int ulysses) {
  return ulysses >= 1 && n_kv_heads >= 1 && n_heads % ulysses == 0 &&
         (n_kv_heads % ulysses == 0 || ulysses % n_kv_heads == 0);
}

std::vector<int> valid_head_chunks(int n_heads, int n_kv_heads, int sp) {
  std::vector<int> valid;
  if (sp < 1 || n_heads % sp != 0 || n_kv_heads < 1 || n_heads % n_kv_heads != 0) return valid;
  const int per_rank = n_heads / sp, group = n_heads / n_kv_heads;
  for (int chunks = 1; chunks <= per_rank; ++chunks) {
    if (per_rank % chunks != 0) continue;
    const int stage = per_rank / chunks;
    if (stage % group == 0 || group % stage == 0) valid.push_back(chunks);
  }
  return valid;
}

}  // namespace ulysses
