#include "myriad/train/async_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <limits>

#include "myriad/ckpt/checksum.h"
#include "myriad/classifier/sharded_softmax.h"
#include "myriad/comm/process_context.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/clock.h"
#include "myriad/util/error.h"
#include "myriad/util/fault_point.h"
#include "myriad/util/format.h"
#include "myriad/util/log.h"
#include "myriad/util/process_info.h"
#include "myriad/util/remove_tree.h"

namespace myriad {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// The most host memory the snapshot buffers may take: `requested` bytes, or without a request
// this rank's share of the host's free memory, less a quarter left to the data loaders and the
// rest (collective: a request beyond the share is an Error on every rank).
int64_t host_memory_limit(const ProcessContext& context, int64_t requested) {
  int64_t limit = requested > 0 ? requested : std::numeric_limits<int64_t>::max();
  on_every_rank(context, "sizing the checkpoint snapshots", [&] {
    const std::optional<int64_t> available = available_memory_bytes();
    if (!available) return;
    const int64_t share = *available / std::max(1, context.local_size()) / 4 * 3;
    MYRIAD_CHECK(requested == 0 || requested <= share,
                 "--checkpoint-host-memory {} is more than this rank's share of the host's free "
                 "memory ({} free for {} rank(s) on {})",
                 format_bytes(static_cast<double>(requested)),
                 format_bytes(static_cast<double>(*available)), context.local_size(),
                 context.hostname());
    limit = std::min(limit, share);
  });
  return limit;
}

}  // namespace

int64_t AsyncCheckpointer::host_memory_for(const ProcessContext& context,
                                           const TrainingState& state) {
  return SnapshotWriter::memory_for(checkpoint_files(context, state));
}

AsyncCheckpointer::AsyncCheckpointer(const ProcessContext& context, CheckpointStore store,
                                     const TrainingState& state, CheckpointOptions options,
                                     std::function<void(const nlohmann::json&)> record)
    : context_(context),
      store_(std::move(store)),
      options_(options),
      record_(std::move(record)),
      memory_limit_(host_memory_limit(context, options.host_memory)),
      writer_(state.classifier->device(),
              std::min(memory_limit_, host_memory_for(context, state))) {}

void AsyncCheckpointer::save(const TrainingState& state) {
  const auto start = Clock::now();
  if (pending_) {
    if (!warned_overlap_) {
      log_warn(
          "the checkpoint at step {} is due while the one at step {} is still being written: "
          "training waits for it (said once; a larger --checkpoint-every avoids it)",
          state.step, pending_->step);
      warned_overlap_ = true;
    }
    complete();
  }
  Pending p;
  p.step = state.step;
  p.start = start;
  p.temporary = store_.temporary_for(state.step);
  const ShardedMarginSoftmax& classifier = *state.classifier;
  p.manifest.step = state.step;
  p.manifest.position = state.position;
  p.manifest.world_size = context_.size();
  p.manifest.num_classes = classifier.partition().num_classes();
  p.manifest.embedding_size = classifier.options().embedding_size;
  p.manifest.config = state.config;
  for (int r = 0; r < context_.size(); ++r) {
    p.manifest.shards.push_back(
        {shard_file_name(r), r, classifier.partition().offset(r), classifier.partition().size(r)});
  }
  pending_ = std::move(p);
  std::vector<SnapshotFile> files = checkpoint_files(context_, state);
  // Optimizer states that the first steps created were not there to be counted at the start.
  const int64_t whole = SnapshotWriter::memory_for(files);
  writer_.reserve(std::min(memory_limit_, whole));
  if (writer_.host_memory_bytes() < whole && !said_streaming_) {
    log_info(
        "a checkpoint snapshot of {} does not fit in {} of host memory: it streams through it in "
        "chunks of {} (double buffering), and training waits for all but the last",
        format_bytes(static_cast<double>(whole)),
        format_bytes(static_cast<double>(writer_.host_memory_bytes())),
        format_bytes(
            static_cast<double>(SnapshotWriter::buffer_bytes(writer_.host_memory_bytes()))));
    said_streaming_ = true;
  }
  writer_.begin(pending_->temporary, std::move(files), state.step);
  pending_->blocked_seconds = seconds_since(start);
  if (options_.sync) complete();
}

void AsyncCheckpointer::poll() {
  if (pending_ && context_.all_true(writer_.done())) publish();
}

void AsyncCheckpointer::complete() {
  if (pending_) publish();
}

void AsyncCheckpointer::publish() {
  SnapshotOutcome mine = writer_.wait();
  const auto start = Clock::now();
  if (const char* fault = std::getenv("MYRIAD_FAULT_SAVE_RANK");
      fault != nullptr && std::atoi(fault) == context_.rank() && mine.error.empty()) {
    mine.error = "injected failure (MYRIAD_FAULT_SAVE_RANK)";  // a rank whose writes failed
  }
  const Pending p = std::move(*pending_);
  pending_.reset();
  const std::string what = str_format("checkpoint at step {}", p.step);
  Published published;
  try {
    published = gather_files(p, mine, what);
    fault_point("manifest", p.step);
    on_every_rank(context_, what, [&] {
      if (context_.rank() == 0) write_manifest_and_rename(p, published.manifest);
    });
  } catch (const Error&) {
    // Every rank is past its writes: nothing more goes into the temporary directory, and the
    // previous checkpoint stays in use.
    if (context_.rank() == 0) remove_tree(p.temporary);
    throw;
  }
  const double durable = seconds_since(p.start);
  // A synchronous save holds training until now; an asynchronous one for the save before it, its
  // snapshot (on the host and on the device), and this publication.
  published.blocked = options_.sync ? durable : published.blocked + seconds_since(start);
  report_published(p, mine, published, durable);
}

AsyncCheckpointer::Published AsyncCheckpointer::gather_files(const Pending& p,
                                                             const SnapshotOutcome& mine,
                                                             const std::string& what) const {
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [name, entry] : mine.files)
    files[name] = {{"bytes", entry.bytes}, {"crc32", crc32_hex(entry.crc32)}};
  const nlohmann::json report = {{"error", mine.error},
                                 {"files", files},
                                 {"blocked", p.blocked_seconds + mine.device_copy_seconds},
                                 {"write", mine.write_seconds},
                                 {"sync", mine.sync_seconds},
                                 {"checksum", mine.checksum_seconds}};
  // One gather: whether every rank's files are durable, and what they are.
  std::vector<nlohmann::json> parts;
  std::vector<std::string> errors;
  for (const std::string& reported : context_.all_gather_strings(report.dump())) {
    parts.push_back(nlohmann::json::parse(reported));
    errors.push_back(parts.back()["error"].get<std::string>());
  }
  raise_first_failure(errors, what);
  Published published{p.manifest};
  for (const nlohmann::json& part : parts) {
    for (const auto& [name, entry] : file_entries_from_json(part["files"], "a rank's file list")) {
      published.manifest.files[name] = entry;
      published.bytes += entry.bytes;
    }
    published.blocked = std::max(published.blocked, part["blocked"].get<double>());
    published.write = std::max(published.write, part["write"].get<double>());
  }
  return published;
}

void AsyncCheckpointer::write_manifest_and_rename(const Pending& p, Manifest& manifest) {
  manifest.created = utc_text(unix_seconds());
  write_file_atomically((fs::path(p.temporary) / kManifestFile).string(),
                        manifest.to_json().dump(2) + "\n");
  sync_path(p.temporary);
  // The last pruning is done before anything is renamed.
  if (pruning_.valid()) pruning_.get();
  store_.publish(p.temporary, p.step);
  // Deleting tens of gigabytes takes seconds: not on training's time.
  pruning_ = std::async(std::launch::async, [store = store_, step = p.step, keep = options_.keep] {
    store.prune(step, keep);
  });
}

void AsyncCheckpointer::report_published(const Pending& p, const SnapshotOutcome& mine,
                                         const Published& published, double durable) const {
  const double bytes = static_cast<double>(published.bytes), write = published.write;
  log_info(
      "checkpoint at step {} published in {}: {}, training blocked {:.2f} s, written in {:.1f} s "
      "({:.2f} GB/s), durable after {:.1f} s (rank 0: fsync {:.1f} s, checksum {:.1f} s){}",
      p.step, store_.directory_for(p.step), format_bytes(bytes), published.blocked, write,
      write > 0 ? bytes / write / 1e9 : 0.0, durable, mine.sync_seconds, mine.checksum_seconds,
      options_.sync ? " [--checkpoint-sync]" : "");
  if (record_ && context_.rank() == 0) {
    record_({{"kind", "checkpoint"},
             {"step", p.step},
             {"async", !options_.sync},
             {"bytes", published.bytes},
             {"blocked_seconds", published.blocked},
             {"write_seconds", write},
             {"durable_seconds", durable}});
  }
}

void save_checkpoint(const ProcessContext& context, const CheckpointStore& store,
                     const TrainingState& state, int keep) {
  CheckpointOptions options;
  options.keep = keep;
  options.sync = true;
  AsyncCheckpointer(context, store, state, options).save(state);
}

}  // namespace myriad
