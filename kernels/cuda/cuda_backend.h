// The CUDA backend: bf16 activations and weights, fp32 master weights and optimizer state.
// This header has no CUDA types, so host-only code (the factory, NcclComm) can include it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace ulysses {

class CudaTimeline;

// Throws "no CUDA device: <reason>" when no usable GPU is present. Under mpirun each rank
// takes the GPU of its node-local rank (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or
// SLURM_LOCALID, modulo the device count). A memory limit of 0 becomes the device's free
// memory, so a run that cannot fit fails with OutOfMemoryError listing the categories.
std::unique_ptr<Backend> make_cuda_backend(int64_t memory_limit_bytes,
                                           AttentionKernel attention = AttentionKernel::native);

// The cudaStream_t (as void*) every op of a CUDA backend runs on, for communicators that
// must order their work after it; throws std::invalid_argument for other backends.
void* cuda_backend_stream(Backend& backend);

// The CUDA device ordinal a CUDA backend uses; throws std::invalid_argument for others.
int cuda_backend_device(Backend& backend);

// The device timeline of a CUDA backend (kernels/cuda/cuda_timeline.cuh), to which a device
// communicator hands its collectives while the profiler times the device; throws for other
// backends.
CudaTimeline& cuda_backend_timeline(Backend& backend);

// GPUs this process can see (0 when CUDA reports an error).
int cuda_device_count();

// cudnnGetVersion() of the library this process loads; 0 when this build has no cuDNN.
int64_t cuda_cudnn_version();

}  // namespace ulysses
