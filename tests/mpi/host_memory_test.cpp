// Host memory per rank during initialisation, checkpoint save, resume and init_from
// (docs/memory.md, "Host memory per rank"): under ZeRO-3 no rank may hold a host copy of the
// whole model. Each phase's growth of the resident set (the kernel's peak, VmHWM, reset
// before the phase) must stay below what the rank stores + one ZeRO unit + a fixed margin,
// for a model whose whole f32 copy is larger than that bound.
//
// On the cpu backend the "device" buffers are host memory too: a training step runs first so
// that every one of them is resident before anything is measured. glibc's malloc is told to
// map every large block afresh, so a phase's host buffers show up in its peak even when an
// earlier phase freed as much.
#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/train/trainer.h"
#include "parallel/mesh.h"
#include "tests/mpi/mpi_testing.h"

namespace ulysses::testing {
namespace {

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM").
int64_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  return -1;
}

// How far the resident set rose above where it stood when `phase` began.
int64_t peak_growth(const std::function<void()>& phase) {
  std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS
  const int64_t before = status_bytes("VmRSS");
  phase();
  return status_bytes("VmHWM") - before;
}

constexpr int64_t kMiB = 1 << 20;
// Stacks, the log, JSON and file names: what a phase may hold besides its pieces.
constexpr int64_t kMargin = 2 * kMiB;

class HostMemory : public MpiTest {
 protected:
  void SetUp() override {
    // Fixed thresholds (no dynamic adjustment): blocks above 64 KiB are always fresh
    // mappings, and the heap gives freed memory back.
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    mallopt(M_TRIM_THRESHOLD, 64 * 1024);
    dir_ = "/tmp/ulysses_host_memory_" + std::to_string(job_id());
  }
  void TearDown() override {
    mpi_world().barrier();
    if (mpi_world().rank() == 0) std::filesystem::remove_all(dir_);
    MpiTest::TearDown();
  }
  // One number for the whole job: rank 0's process id.
  static int64_t job_id() {
    double id = mpi_world().rank() == 0 ? double(::getpid()) : 0.0;
    mpi_world().all_reduce_host(&id, 1, ReduceOp::max);
    return int64_t(id);
  }
  Config config() const {
    return parse_config(
        "model: {family: llama, n_layers: 8, d_model: 128, n_heads: 4, n_kv_heads: 2, d_ff: 512, "
        "vocab_size: 4096}\n"
        "train: {steps: 2, batch_size: 1, seq_len: 32, checkpoint: {dir: " +
            dir_ +
            "}}\n"
            "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n"
            "parallel: {sp: 1, zero_stage: 3, bucket_mb: 1}\n",
        {}, "host_memory.yaml");
  }
  std::string dir_;
};

TEST_F(HostMemory, EachRankHoldsItsShareAndOneUnitDuringInitSaveResumeAndInitFrom) {
  Comm& world = mpi_world();
  auto backend = make_backend(BackendKind::cpu, 0);
  backend->set_num_threads(1);
  const Config run = config();
  Mesh mesh = make_mesh(world, run.parallel.sp);
  Trainer trainer(run, *backend, mesh);
  trainer.train_step();  // every buffer of the model and optimizer is resident from here

  const ShardLayout& layout = trainer.model().state().layout();
  const int64_t whole = layout.total() * int64_t(sizeof(float));
  const int64_t bound =
      (layout.shard_numel() + layout.max_padded_unit()) * int64_t(sizeof(float)) + kMargin;
  ASSERT_GT(whole, bound) << "the model is too small for the bound to tell anything";

  // The measurement sees a whole-model host copy (so a phase that made one would fail).
  const int64_t copy = peak_growth([&] {
    std::vector<float> host(size_t(layout.total()));
    trainer.model().download_weights(host.data());
  });
  EXPECT_GE(copy, whole) << "the measurement misses a whole-model host copy";

  const int64_t init = peak_growth([&] { trainer.model().init_weights(5); });
  std::string folder;
  const int64_t save = peak_growth([&] { folder = trainer.save_checkpoint(); });
  const int64_t resume = peak_growth([&] { trainer.resume(folder); });

  Config from = run;
  from.model.init_from = folder;
  from.train.checkpoint.dir = dir_ + "/fine_tune";
  Trainer second(from, *backend, mesh);
  second.train_step();
  const int64_t init_from = peak_growth([&] { second.load_initial_weights(); });

  const std::string rank = "rank " + std::to_string(world.rank()) + ": ";
  EXPECT_LE(init, bound) << rank << "initialisation grew the host memory by " << init
                         << " bytes; the bound is " << bound << " (whole model " << whole << ")";
  EXPECT_LE(save, bound) << rank << "saving grew it by " << save << " bytes; bound " << bound;
  EXPECT_LE(resume, bound) << rank << "resuming grew it by " << resume << " bytes; bound " << bound;
  EXPECT_LE(init_from, bound) << rank << "init_from grew it by " << init_from << " bytes; bound "
                              << bound;
  if (world.rank() == 0)
    std::printf(
        "host memory growth (bytes): init %lld, save %lld, resume %lld, init_from %lld; "
        "bound %lld, whole model %lld\n",
        (long long)init, (long long)save, (long long)resume, (long long)init_from, (long long)bound,
        (long long)whole);
}

}  // namespace
}  // namespace ulysses::testing
