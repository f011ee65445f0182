#include "core/checkpoint/checkpoint.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <system_error>
#include <vector>

#include "core/checkpoint/checkpoint_overwrite.h"
#include "core/checkpoint/checkpoint_space.h"
#include "core/checkpoint/checkpoint_weights.h"
#include "core/checkpoint/file_util.h"
#include "core/checkpoint/optimizer_file.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/safetensors_placed.h"
#include "parallel/agreement.h"
#include "parallel/watchdog.h"

namespace ulysses {

namespace fs = std::filesystem;

namespace {

// A kill while deleting leaves a hidden .pruning- folder, never a half-deleted step folder
// (docs/checkpoints.md); the next start deletes it (core/checkpoint/checkpoint_dir.h).
void delete_pruned_folder(const std::string& folder) {
  const fs::path path(folder);
  const std::string doomed =
      (path.parent_path() / (kPruningPrefix + path.filename().string())).string();
  fs::remove_all(doomed);
  rename_or_throw(folder, doomed);
  fs::remove_all(doomed);
}

}  // namespace

Checkpointer::Checkpointer(const Config& config, Backend& backend, Comm& world)
    : config_(config), backend_(backend), world_(world) {}

bool Checkpointer::training_state_is_finite(const ZeroState& state,
                                            const OptimizerMoments& optimizer) {
  // A sum of squares in double is finite exactly when every f32 element is.
  double sum = backend_.sum_squares(state.master()) + backend_.sum_squares(optimizer.first) +
               backend_.sum_squares(optimizer.second);
  double nonfinite = std::isfinite(sum) ? 0.0 : 1.0;
  world_.all_reduce_host(&nonfinite, 1, ReduceOp::max);
  return nonfinite == 0.0;
}

void Checkpointer::replace_after_first_save(std::vector<std::string> folders) {
  replaced_ = std::move(folders);
}

std::string Checkpointer::save(const CheckpointProgress& progress, Model& model,
                               const OptimizerMoments& optimizer) {
  const int64_t step = progress.step;
  if (!training_state_is_finite(model.state(), optimizer))
    throw JobError(ExitCode::nonfinite,
                   "not saving step " + std::to_string(step) +
                       ": the weights or optimizer moments hold NaN or infinite values; the "
                       "checkpoints already written are kept. " +
                       (progress.good_folder.empty()
                            ? std::string("None of them was measured by a normal step after it: "
                                          "start again with a lower train.lr or a "
                                          "train.grad_clip")
                            : "The newest saved before the trouble began is " +
                                  progress.good_folder + " (docs/failures.md)"),
                   world_.rank() == 0);
  Watchdog::SlowWork slow(world_.watchdog().get(), "writing a checkpoint");
  const std::string dir = config_.train.checkpoint.dir;
  const std::string name = checkpoint_folder_name(step);
  const std::string temp_path = dir + "/" + kSavingPrefix + name;
  // An I/O failure on any rank ends the save on every rank together, with the same exit and
  // no half-written folder left behind (docs/failures.md#a-full-disk).
  std::string failure;  // this rank's; each phase of the save ends with every rank's verdict
  if (world_.rank() == 0) {
    const std::optional<uint64_t> available = available_bytes(dir);
    if (available)
      failure = checkpoint_space_at_save(
          dir, step, checkpoint_bytes(model.table(), model.state().layout().world()), *available);
    attempt_write(step, failure, [&] {
      fs::create_directories(dir);
      fs::remove_all(temp_path);
      fs::create_directory(temp_path);
    });
  }
  stop_if_any_failed(temp_path, failure);
  const std::vector<double> optimizer_checksums =
      write_optimizer_files(temp_path, step, model, optimizer);
  write_weights(temp_path, step, model);
  if (world_.rank() == 0)
    attempt_write(step, failure, [&] {
      write_state_and_manifest(temp_path, progress, model, optimizer_checksums);
      publish(temp_path, name, progress.good_folder);
    });
  stop_if_any_failed(temp_path, failure);
  return dir + "/" + name;
}

void Checkpointer::attempt_write(int64_t step, std::string& failure,
                                 const std::function<void()>& write) {
  if (!failure.empty()) return;
  try {
    write();
  } catch (const std::exception& problem) {
    failure = "the checkpoint of step " + std::to_string(step) +
              " could not be written: " + problem.what() +
              ". Its temporary folder is removed and the checkpoints already written in "
              "train.checkpoint.dir '" +
              config_.train.checkpoint.dir +
              "' are intact; once the cause is gone (a full disk: free space) continue with "
              "--resume auto (docs/failures.md#a-full-disk)";
  }
}

void Checkpointer::stop_if_any_failed(const std::string& temp_path, const std::string& failure) {
  double failed = failure.empty() ? 0.0 : 1.0;
  world_.all_reduce_host(&failed, 1, ReduceOp::max);
  if (failed == 0.0) return;
  if (world_.rank() == 0) {
    std::error_code ignored;
    fs::remove_all(temp_path, ignored);
  }
  agree_on_failure(world_, failure, ExitCode::runtime);
}

std::vector<double> Checkpointer::write_optimizer_files(const std::string& temp_path, int64_t step,
                                                        Model& model,
                                                        const OptimizerMoments& optimizer) {
  // Optimizer state as flat ranges of the parameter buffer, one file per shard (ZeRO: one
  // per rank; otherwise rank 0 writes the whole range), so that a run with another world
  // size or stage can take any range from any file (core/checkpoint/optimizer_file.h).
  const bool sharded = model.state().layout().world() > 1;
  const int shards = sharded ? world_.size() : 1;
  // Pieces of at most one unit travel through the host (docs/memory.md, "Host memory per rank").
  const int64_t piece = model.state().host_piece();
  const bool writes = sharded || world_.rank() == 0;
  const int shard = sharded ? world_.rank() : 0;
  // Each optimizer file's checksum is computed by the rank that wrote it; rank 0 collects
  // them for the manifest (CRC-32 and sizes are exact in a double).
  std::vector<double> checksums(size_t(2 * shards), 0.0);
  std::string failure;
  if (writes)
    attempt_write(step, failure, [&] {
      std::vector<FlatRange> ranges;
      int64_t count = 0;
      for (const ShardSegment& segment : optimizer.segments) {
        ranges.emplace_back(segment.begin, segment.end);
        count += segment.size();
      }
      const std::string path = temp_path + "/" + optimizer_file_name(shard, shards);
      const std::string header = optimizer_file_header(ranges, model.table().total_numel(), path);
      create_placed_safetensors(path, header, 2 * uint64_t(count) * sizeof(float));
      PlacedSafetensorsWriter moments(path, header.size());
      std::vector<float> host;
      int64_t packed = 0;  // where the segment starts in the file's tensors
      for (const ShardSegment& segment : optimizer.segments) {
        for (int64_t done = 0; done < segment.size(); done += piece) {
          const int64_t n = std::min(piece, segment.size() - done);
          host.resize(size_t(n));
          backend_.download(host.data(), optimizer.first.flat_range(segment.shard_begin + done, n));
          moments.write(packed + done, n, host.data());
          backend_.download(host.data(),
                            optimizer.second.flat_range(segment.shard_begin + done, n));
          moments.write(count + packed + done, n, host.data());
        }
        packed += segment.size();
      }
      moments.finish();
      checksums[size_t(2 * shard)] = double(crc32_of_file(path));
      checksums[size_t(2 * shard + 1)] = double(fs::file_size(path));
    });
  stop_if_any_failed(temp_path, failure);
  world_.all_reduce_host(checksums.data(), int(checksums.size()), ReduceOp::sum);
  return checksums;
}

void Checkpointer::write_weights(const std::string& temp_path, int64_t step, Model& model) {
  // Rank 0 creates the file, then each rank writes the master weights it stores at their
  // offsets, one unit at a time (docs/checkpoints.md, "Writing the weights").
  const ParamTable& table = model.table();
  const std::string path = temp_path + "/" + kCheckpointModelFile;
  const std::string header =
      checkpoint_weights_header(table, step, name_of(config_.model.family), path);
  std::string failure;
  if (world_.rank() == 0)
    attempt_write(step, failure, [&] {
      create_placed_safetensors(path, header, uint64_t(table.total_numel()) * sizeof(float));
    });
  stop_if_any_failed(temp_path, failure);
  const bool writes = model.state().layout().world() > 1 || world_.rank() == 0;
  if (writes)
    attempt_write(step, failure, [&] {
      PlacedSafetensorsWriter weights(path, header.size());
      model.state().download_stored_weights([&](int64_t begin, int64_t count, const float* values) {
        weights.write(begin, count, values);
      });
      weights.finish();
    });
  stop_if_any_failed(temp_path, failure);
}

void Checkpointer::write_state_and_manifest(const std::string& temp_path,
                                            const CheckpointProgress& progress, Model& model,
                                            const std::vector<double>& optimizer_checksums) {
  const int shards = int(optimizer_checksums.size() / 2);
  TrainerState state;
  state.step = progress.step;
  state.sequences_per_step = int64_t(config_.train.grad_accum) * config_.train.batch_size *
                             (world_.size() / config_.parallel.sp);
  state.loss = progress.loss;
  state.guard = progress.guard;
  state.world_size = world_.size();
  state.sp = config_.parallel.sp;
  state.zero_stage = model.state().stage();
  state.model.model = config_.model;
  state.model.rope_theta = config_.model.rope_theta;
  state.model.norm_eps = config_.model.norm_eps;
  for (int i = 0; i < shards; ++i) state.optimizer_shards.push_back(optimizer_file_name(i, shards));
  state.data_keys = data_order_keys(config_);
  state.data_seq_len = progress.seq_len;
  state.train_sequences = progress.train_sequences;
  state.lr_schedule_keys = lr_schedule_keys(config_);
  write_file_durably(temp_path + "/" + kCheckpointStateFile, trainer_state_json(state));

  CheckpointManifest manifest;
  manifest.step = progress.step;
  for (int i = 0; i < shards; ++i)
    manifest.files.push_back({state.optimizer_shards[size_t(i)],
                              uint64_t(optimizer_checksums[size_t(2 * i + 1)]),
                              uint32_t(optimizer_checksums[size_t(2 * i)])});
  for (const std::string file : {kCheckpointModelFile, kCheckpointStateFile}) {
    const std::string path = temp_path + "/" + file;
    manifest.files.push_back({file, uint64_t(fs::file_size(path)), crc32_of_file(path)});
  }
  write_file_durably(temp_path + "/" + kCheckpointManifestFile, manifest_json(manifest));
  fsync_directory(temp_path);
}

void Checkpointer::publish(const std::string& temp_path, const std::string& name,
                           const std::string& good_folder) {
  const std::string dir = config_.train.checkpoint.dir;
  const std::string final_path = dir + "/" + name;
  // The checkpoints this run replaces go only once its own is proven: read back and
  // checked against its manifest (docs/checkpoints.md#overwriting).
  const bool replacing = !replaced_.empty();
  if (replacing) {
    verify_checkpoint(temp_path);
    move_replaced_aside(dir, replaced_, name);
  }
  // A folder of the same step (a rerun) is moved aside, never half-replaced.
  const std::string old_path = dir + "/.old-" + name;
  fs::remove_all(old_path);
  if (fs::exists(final_path)) rename_or_throw(final_path, old_path);
  rename_or_throw(temp_path, final_path);
  fsync_directory(dir);
  point_latest_at(dir, name);
  fs::remove_all(old_path);
  if (replacing) {
    delete_replaced(dir);
    spdlog::info(
        "train.checkpoint.overwrite: {} is written and verified; deleted the {} checkpoint(s) "
        "it replaces",
        name, replaced_.size());
    replaced_.clear();
  }
  prune(final_path, good_folder);
}

std::vector<std::string> folders_to_prune(const std::vector<std::string>& newest_first,
                                          int keep_last, const std::string& just_written,
                                          const std::string& good_folder) {
  std::vector<std::string> removed;
  if (keep_last <= 0) return removed;
  for (size_t i = size_t(keep_last); i < newest_first.size(); ++i) {
    const std::string& folder = newest_first[i];
    if (folder != just_written && folder != good_folder) removed.push_back(folder);
  }
  return removed;
}

void Checkpointer::prune(const std::string& just_written, const std::string& good_folder) {
  const int keep = config_.train.checkpoint.keep_last;
  if (keep <= 0) return;
  std::vector<std::string> folders;
  for (const auto& [step, folder] : checkpoint_step_folders(config_.train.checkpoint.dir))
    folders.push_back(folder);
  // The good folder as the trainer names it may be spelled otherwise (a resumed run's path).
  std::error_code error;
  for (const std::string& folder : folders_to_prune(folders, keep, just_written, good_folder))
    if (good_folder.empty() || !fs::equivalent(folder, good_folder, error))
      delete_pruned_folder(folder);
}

TrainerState Checkpointer::load(const std::string& folder, Model& model,
                                const OptimizerMoments& optimizer) {
  Watchdog::SlowWork slow(world_.watchdog().get(), "reading a checkpoint");
  // Rank 0 alone reads every file for its checksum, and every rank learns the verdict: the
  // other ranks read only what they load (docs/checkpoints.md).
  std::string corrupt;
  if (world_.rank() == 0) {
    try {
      verify_checkpoint(folder);
    } catch (const CheckpointError& error) {
      corrupt = error.what();
    }
  }
  agree_on_failure(world_, corrupt, ExitCode::bad_input);
  const TrainerState state = read_trainer_state(folder);
  const std::string state_path = folder + "/" + kCheckpointStateFile;
  const ModelConfig& recorded = state.model.model;
  const ModelConfig& m = config_.model;
  auto require_same = [&](const char* key, const std::string& theirs, const std::string& ours) {
    if (theirs != ours)
      throw CheckpointError("checkpoint '" + folder + "' was written for model." + key + "=" +
                            theirs + ", this run has model." + key + "=" + ours);
  };
  require_same("family", name_of(recorded.family), name_of(m.family));
  require_same("n_layers", std::to_string(recorded.n_layers), std::to_string(m.n_layers));
  require_same("d_model", std::to_string(recorded.d_model), std::to_string(m.d_model));
  require_same("n_heads", std::to_string(recorded.n_heads), std::to_string(m.n_heads));
  require_same("n_kv_heads", std::to_string(recorded.n_kv_heads), std::to_string(m.n_kv_heads));
  require_same("d_ff", std::to_string(recorded.d_ff), std::to_string(m.d_ff));
  require_same("vocab_size", std::to_string(recorded.vocab_size), std::to_string(m.vocab_size));
  require_same("max_seq_len", std::to_string(recorded.max_seq_len), std::to_string(m.max_seq_len));

  const ParamTable& table = model.table();
  const int64_t total = table.total_numel();
  // Each rank reads only the ranges it stores, straight from the mapped file.
  try {
    const CheckpointWeights weights(folder, table);
    model.load_weights(
        [&](int64_t begin, int64_t count, float* out) { weights.read(begin, count, out); });
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& error) {
    throw CheckpointError(error.what());
  }

  // This rank's moments: the parts of every file's ranges that overlap its own segments,
  // moved to the device a piece of at most one unit at a time.
  const int64_t piece = model.state().host_piece();
  const std::vector<ShardSegment>& mine = optimizer.segments;
  std::vector<float> host;
  int64_t needed = 0, covered = 0;
  for (const ShardSegment& segment : mine) needed += segment.size();
  for (const std::string& shard_name : state.optimizer_shards) {
    const std::string path = folder + "/" + shard_name;
    try {
      SafetensorsReader shard(path);
      const std::vector<FlatRange> ranges = optimizer_file_ranges(shard, total);
      int64_t count = 0;
      bool overlaps = false;
      for (const auto& [begin, end] : ranges) {
        count += end - begin;
        for (const ShardSegment& segment : mine)
          overlaps = overlaps || (std::max(begin, segment.begin) < std::min(end, segment.end));
      }
      // Another rank's moments: not read at all.
      if (!overlaps) continue;
      shard.require_shape(kFirstMomentTensor, {count});
      shard.require_shape(kSecondMomentTensor, {count});
      int64_t packed = 0;  // where the current range starts in the file's tensors
      for (const auto& [begin, end] : ranges) {
        for (const ShardSegment& segment : mine) {
          const int64_t overlap_begin = std::max(begin, segment.begin);
          const int64_t overlap_end = std::min(end, segment.end);
          for (int64_t at = overlap_begin; at < overlap_end; at += piece) {
            const int64_t n = std::min(piece, overlap_end - at);
            const int64_t from = packed + (at - begin);
            const int64_t to = segment.shard_begin + (at - segment.begin);
            host.resize(size_t(n));
            shard.read_f32_range(kFirstMomentTensor, from, n, host.data());
            backend_.upload(optimizer.first.flat_range(to, n), host.data());
            shard.read_f32_range(kSecondMomentTensor, from, n, host.data());
            backend_.upload(optimizer.second.flat_range(to, n), host.data());
            covered += n;
          }
        }
        packed += end - begin;
      }
    } catch (const CheckpointError&) {
      throw;
    } catch (const std::exception& error) {
      throw CheckpointError("optimizer state '" + path + "': " + error.what());
    }
  }
  if (covered != needed)
    throw CheckpointError("the optimizer files of '" + folder + "' cover " +
                          std::to_string(covered) + " of the " + std::to_string(needed) +
                          " elements this rank needs");
  return state;
}

}  // namespace ulysses
