// kernels.attention: auto, for every combination of device, cuDNN in the build (and its
// version) and head dim; and the trainer's log line that says which attention runs and why.
#include <gtest/gtest.h>

#include <string>

#include "kernels/backend.h"
#include "testing.h"

namespace ulysses {
namespace {

constexpr int64_t kCudnn919 = 91900;

TEST(AttentionChoice, AutoTakesCudnnOnCudaWhenTheLibraryAndTheShapeFit) {
  for (int head_dim : {8, 64, 128}) {
    const AttentionChoice choice =
        choose_attention(AttentionKernel::automatic, BackendKind::cuda, head_dim, kCudnn919);
    EXPECT_EQ(choice.kernel, AttentionKernel::cudnn) << head_dim;
    EXPECT_EQ(choice.reason,
              "kernels.attention: auto: cuDNN 9.19.0 fits head dim " + std::to_string(head_dim));
  }
  EXPECT_EQ(choose_attention(AttentionKernel::automatic, BackendKind::cuda, 64,
                             kCudnnAttentionMinimumVersion)
                .kernel,
            AttentionKernel::cudnn);
}

TEST(AttentionChoice, AutoTakesTheNativeKernelsOtherwiseAndSaysWhy) {
  struct Case {
    BackendKind device;
    int head_dim;
    int64_t version;
    std::string because;
  };
  const Case cases[] = {
      {BackendKind::cpu, 64, kCudnn919, "the cpu backend has one attention"},
      {BackendKind::cuda, 64, 0, "this build has no cuDNN"},
      {BackendKind::cuda, 64, 91500, "the loaded cuDNN is 9.15.0, older than the 9.16"},
      {BackendKind::cuda, 36, kCudnn919, "a multiple of 8 and at most 128, this model's is 36"},
      {BackendKind::cuda, 256, kCudnn919, "a multiple of 8 and at most 128, this model's is 256"},
  };
  for (const Case& c : cases) {
    const AttentionChoice choice =
        choose_attention(AttentionKernel::automatic, c.device, c.head_dim, c.version);
    EXPECT_EQ(choice.kernel, AttentionKernel::native) << c.because;
    EXPECT_NE(choice.reason.find(c.because), std::string::npos) << choice.reason;
  }
}

TEST(AttentionChoice, AutoTakesTheNativeKernelsForDocuments) {
  // Packed documents and padding are masked by the native kernels only (docs/parallelism.md).
  const AttentionChoice choice =
      choose_attention(AttentionKernel::automatic, BackendKind::cuda, 64, kCudnn919, true);
  EXPECT_EQ(choice.kernel, AttentionKernel::native);
  EXPECT_EQ(choice.reason,
            "kernels.attention: auto: packed documents or padding need the native kernels' "
            "document mask");
}

// The native kernels' log line names the tensor-core kernels where they take the head dim and
// the FMA ones elsewhere (tests/test_cuda_attention_emulated.cpp checks that this is the
// kernels' own rule).
TEST(AttentionChoice, TheLogNamesWhichNativeKernelsRun) {
  for (int head_dim : {8, 40, 64, 128})
    EXPECT_NE(native_attention_kernels(head_dim).find("tensor cores"), std::string::npos)
        << head_dim;
  for (int head_dim : {2, 36, 136})
    EXPECT_NE(native_attention_kernels(head_dim).find("FMA units for head dim " +
                                                      std::to_string(head_dim)),
              std::string::npos)
        << head_dim;
}

TEST(AttentionChoice, AnExplicitSettingIsKept) {
  EXPECT_EQ(choose_attention(AttentionKernel::native, BackendKind::cuda, 64, kCudnn919).kernel,
            AttentionKernel::native);
  EXPECT_EQ(choose_attention(AttentionKernel::cudnn, BackendKind::cuda, 64, 0).kernel,
            AttentionKernel::cudnn);
}

TEST(AttentionChoice, AnUnresolvedAutoIsRefusedByTheBackendFactory) {
  EXPECT_THROW(make_backend(BackendKind::cpu, 0, AttentionKernel::automatic),
               std::invalid_argument);
}

TEST(AttentionChoice, TheTrainerLogsWhichAttentionAutoChose) {
  testing::TempDir dir;
  testing::write_text_file(dir.file("c.yaml"), R"(
model: {family: llama, n_layers: 1, d_model: 32, n_heads: 4, vocab_size: 96, max_seq_len: 32}
train: {steps: 1, seq_len: 32}
)");
  const testing::CommandResult run =
      testing::run_command(std::string(ULYSSES_TRAIN_BIN) + " --config " + dir.file("c.yaml"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("attention: native (kernels.attention: auto: the cpu backend has "
                            "one attention)"),
            std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace ulysses
