// The CUDA backend's hand-written kernels run on the host through tests/cuda_emulation.h, as a
// Backend: every op launches the same kernels (kernels/cuda/*_kernels.cuh) with the same
// launch shapes as kernels/cuda/*.cu, on host memory. What the real backend hands to cuBLASLt
// (the GEMMs, also inside the LM-head loss) goes to the cpu backend instead, in f32, with a
// bf16 result rounded once as cuBLASLt's is. Native attention only (no cuDNN). The ops' fronts
// check their contracts as on every backend (kernels/op_contracts.h); the real backend's dtype
// checks it leaves out, since the op tests give it valid dtypes. Its profiler times phases on a
// device timeline as the real backend's does, with the emulated device busy while an operation
// runs (docs/profiling.md, "Device time"). Slow (one std::thread per GPU thread): for small
// shapes in tests.
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace ulysses {

std::unique_ptr<Backend> make_emulated_cuda_backend();

}  // namespace ulysses
