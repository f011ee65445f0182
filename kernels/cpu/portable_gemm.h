// The project's own fp32 GEMM, whose bits are the same on every x86-64 machine and for any
// thread count (docs/design.md, "Bits that do not depend on the machine"). OpenBLAS picks
// its kernels by CPU (Haswell, SkylakeX, Zen, ...), and each kernel blocks and orders the
// sums over k its own way, so its last bits differ from machine to machine; the tests whose
// results are compared bit for bit with recorded values use this one instead.
#pragma once

#include <cstdint>

namespace ulysses::cpu {

// c[i][j] = alpha · s(i, j) + beta · c[i][j] for i < m, j < n (c is not read when beta is
// 0), with s(i, j) = Σ_p op(a)(i, p) · op(b)(p, j) taken in order p = 0, 1, ..., k − 1 from
// 0: every product and every partial sum is rounded to fp32 on its own (no FMA, no
// reordering). Row-major, op(x) = x or xᵀ; lda, ldb, ldc are row strides in elements.
void portable_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                    int64_t ldc);

}  // namespace ulysses::cpu
