#include "myriad/ckpt/snapshot_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include <torch/torch.h>

#include "myriad/ckpt/checksum.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/clock.h"
#include "myriad/util/error.h"
#include "myriad/util/fault_point.h"
#include "myriad/util/file_io.h"
#include "myriad/util/hdf5_file.h"

#ifdef MYRIAD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace myriad {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// Large enough that a write runs at the device's speed, small enough that double buffering
// through two of them leaves little idle.
constexpr int64_t kMaxBufferBytes = int64_t{64} << 20;
constexpr int64_t kMinBufferBytes = int64_t{64} << 10;
constexpr int64_t kAlign = 4096;

int64_t round_up(int64_t bytes, int64_t unit) {
  return (bytes + unit - 1) / unit * unit;
}

// Host bytes of a file's datasets as the buffers hold them (in their own dtype, each dataset
// starting aligned).
int64_t host_bytes(const SnapshotFile& file) {
  int64_t bytes = 0;
  for (const SnapshotDataset& d : file.datasets)
    bytes += round_up(d.tensor.numel() * d.tensor.element_size(), 16);
  return bytes;
}

}  // namespace

struct SnapshotWriter::Impl {
  // A run of a dataset's elements in a buffer.
  struct Segment {
    int file = 0;
    int dataset = 0;
    int64_t buffer_offset = 0;
    int64_t elements = 0;
    int64_t stored_offset = 0;  // bytes into the dataset as stored
    torch::ScalarType dtype = torch::kFloat32;
  };
  // A buffer's worth of copies, ready once `ready` has passed.
  struct Piece {
    int buffer = 0;
    std::vector<Segment> segments;
#ifdef MYRIAD_WITH_CUDA
    std::optional<at::cuda::CUDAEvent> ready;
#endif
  };
  struct FileLayout {
    std::string path;
    std::vector<int64_t> offsets;  // of each dataset in the file
    int fd = -1;
    std::vector<CrcRange> written;  // what the writers wrote, with its CRC (under `mutex`)
  };

  torch::Device device;
  int threads;
  std::vector<torch::Tensor> buffers;
  int64_t buffer_bytes = 0;

  // The snapshot in flight.
  bool in_flight = false;
  int64_t step = 0;
  std::string directory;
  std::vector<SnapshotFile> files;
  std::vector<FileLayout> layouts;
  Clock::time_point start;
  SnapshotOutcome outcome;
  std::vector<std::thread> workers;
  std::thread coordinator;

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<int> free_buffers;
  std::deque<Piece> queue;
  int64_t pieces_submitted = 0;
  int64_t pieces_written = 0;
  bool input_complete = false;
  bool layout_ready = false;
  bool finished = false;
  std::string error;
  std::atomic<bool> wrote_once{false};

#ifdef MYRIAD_WITH_CUDA
  std::optional<at::cuda::CUDAStream> copy_stream;
  // On the copy stream: before the first copy, after the files changed by the forward, and after
  // all (the first and the last time the copy).
  std::optional<at::cuda::CUDAEvent> copies_begin, forward_copies_done, copies_done;
  bool forward_ordered = false, backward_ordered = false;
#endif

  Impl(torch::Device d, int64_t host_memory_bytes, int writer_threads)
      : device(d), threads(std::max(1, writer_threads)) {
    buffer_bytes = SnapshotWriter::buffer_bytes(host_memory_bytes);
    reserve(std::max(host_memory_bytes, 2 * buffer_bytes));
#ifdef MYRIAD_WITH_CUDA
    if (device.is_cuda()) copy_stream = at::cuda::getStreamFromPool(false, device.index());
#endif
  }

  void reserve(int64_t bytes) {
    // Pinned buffers let the device copy into them asynchronously, at the link's full speed.
    const auto options = torch::TensorOptions(torch::kUInt8).pinned_memory(device.is_cuda());
    while (static_cast<int64_t>(buffers.size()) * buffer_bytes < bytes)
      buffers.push_back(torch::empty({buffer_bytes}, options));
  }

  void fail(const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex);
    if (error.empty()) error = message;
    changed.notify_all();
  }

  // A free buffer, or nothing once the snapshot has failed.
  std::optional<int> take_buffer() {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return !free_buffers.empty() || !error.empty(); });
    if (!error.empty()) return std::nullopt;
    const int b = free_buffers.back();
    free_buffers.pop_back();
    return b;
  }

  void submit(Piece piece) {
    std::lock_guard<std::mutex> lock(mutex);
    queue.push_back(std::move(piece));
    ++pieces_submitted;
    changed.notify_all();
  }

  // Copies every dataset into buffers, piece by piece (the calling thread): the files changed by
  // the forward first. On GPUs every copy runs on the copy stream, in order, after the work queued
  // so far; one copy engine serves them, so the first files are not held up by the others.
  void copy_all() {
#ifdef MYRIAD_WITH_CUDA
    std::optional<c10::cuda::CUDAStreamGuard> guard;
    if (device.is_cuda()) {
      at::cuda::CUDAEvent queued;
      queued.record(at::cuda::getCurrentCUDAStream(device.index()));
      queued.block(*copy_stream);
      guard.emplace(*copy_stream);
      copies_begin.emplace(cudaEventDefault);
      copies_begin->record(*copy_stream);
    }
#endif
    std::vector<size_t> order;
    for (const bool first : {true, false}) {
      for (size_t f = 0; f < files.size(); ++f)
        if (files[f].changed_by_forward == first) order.push_back(f);
    }
    std::optional<Piece> piece;
    int64_t used = 0;
    const auto flush = [&] {
      if (!piece) return;
#ifdef MYRIAD_WITH_CUDA
      if (device.is_cuda()) {
        piece->ready.emplace();
        piece->ready->record(*copy_stream);
      }
#endif
      submit(std::move(*piece));
      piece.reset();
      fault_point("copy", step);
    };
    for (const size_t f : order) {
      for (size_t d = 0; d < files[f].datasets.size(); ++d) {
        const torch::Tensor flat = files[f].datasets[d].tensor.detach().contiguous().view({-1});
        const int64_t element = flat.element_size();
        const int64_t stored_element = c10::elementSize(hdf5_stored_dtype(flat.scalar_type()));
        for (int64_t begin = 0; begin < flat.numel();) {
          if (piece && used + element > buffer_bytes) flush();
          if (!piece) {
            const std::optional<int> b = take_buffer();
            if (!b) return;
            piece.emplace();
            piece->buffer = *b;
            used = 0;
          }
          const int64_t count = std::min(flat.numel() - begin, (buffer_bytes - used) / element);
          char* base = static_cast<char*>(buffers[piece->buffer].data_ptr());
          torch::from_blob(base + used, {count}, torch::TensorOptions(flat.scalar_type()))
              .copy_(flat.narrow(0, begin, count), /*non_blocking=*/true);
          piece->segments.push_back({static_cast<int>(f), static_cast<int>(d), used, count,
                                     begin * stored_element, flat.scalar_type()});
          used = round_up(used + count * element, 16);
          begin += count;
        }
      }
      // A buffer holds one file's data.
      flush();
#ifdef MYRIAD_WITH_CUDA
      if (device.is_cuda() && files[f].changed_by_forward) {
        forward_copies_done.emplace();
        forward_copies_done->record(*copy_stream);
      }
#endif
    }
#ifdef MYRIAD_WITH_CUDA
    if (device.is_cuda()) {
      copies_done.emplace(cudaEventDefault);
      copies_done->record(*copy_stream);
    }
#endif
  }

  void lay_out() {
    std::error_code failure;
    fs::create_directories(directory, failure);
    MYRIAD_CHECK(!failure, "cannot create '{}': {}", directory, failure.message());
    for (size_t f = 0; f < files.size(); ++f) {
      FileLayout& layout = layouts[f];
      layout.path = (fs::path(directory) / files[f].name).string();
      {
        Hdf5File file(layout.path, Hdf5File::Mode::kCreate);
        for (const SnapshotDataset& d : files[f].datasets) {
          layout.offsets.push_back(file.allocate(d.name, hdf5_stored_dtype(d.tensor.scalar_type()),
                                                 d.tensor.sizes().vec()));
        }
        if (files[f].attributes) files[f].attributes(file);
      }
      layout.fd = open(layout.path.c_str(), O_WRONLY | O_CLOEXEC);
      MYRIAD_CHECK(layout.fd >= 0, "cannot open '{}' for writing: {}", layout.path,
                   std::strerror(errno));
    }
  }

  // Lays the files out, waits for the writers, makes the files durable and checksums them.
  void coordinate() {
    try {
      lay_out();
      bool failed = false;
      {
        std::unique_lock<std::mutex> lock(mutex);
        layout_ready = true;
        changed.notify_all();
        changed.wait(lock, [&] {
          return !error.empty() || (input_complete && pieces_written == pieces_submitted);
        });
        failed = !error.empty();
      }
      if (failed) return finish();
      outcome.write_seconds = seconds_since(start);
      fault_point("fsync", step);
      auto mark = Clock::now();
      for (FileLayout& layout : layouts) {
        MYRIAD_CHECK(fsync(layout.fd) == 0, "cannot sync '{}': {}", layout.path,
                     std::strerror(errno));
        MYRIAD_CHECK(close(layout.fd) == 0, "cannot close '{}': {}", layout.path,
                     std::strerror(errno));
        layout.fd = -1;
      }
      sync_path(directory);
      outcome.sync_seconds = seconds_since(mark);
      mark = Clock::now();
      for (size_t f = 0; f < files.size(); ++f) {
        const int64_t bytes = static_cast<int64_t>(fs::file_size(layouts[f].path));
        outcome.files[files[f].name] = {bytes, file_crc32(layouts[f].path, layouts[f].written)};
        outcome.bytes += bytes;
      }
      outcome.checksum_seconds = seconds_since(mark);
    } catch (const Error& e) {
      fail(e.message());
    } catch (const std::exception& e) {
      fail(e.what());
    }
    finish();
  }

  void finish() {
    std::lock_guard<std::mutex> lock(mutex);
    finished = true;
    changed.notify_all();
  }

  // Writes pieces until the snapshot is complete or has failed.
  void write_pieces() {
    torch::Tensor widened;  // half-precision data as stored (float32)
    while (true) {
      Piece piece;
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] {
          return !error.empty() || (layout_ready && !queue.empty()) ||
                 (input_complete && queue.empty());
        });
        if (queue.empty()) return;
        piece = std::move(queue.front());
        queue.pop_front();
      }
      try {
        if (!error_set()) write_piece(piece, widened);
      } catch (const Error& e) {
        fail(e.message());
      } catch (const std::exception& e) {
        fail(e.what());
      }
      std::lock_guard<std::mutex> lock(mutex);
      free_buffers.push_back(piece.buffer);
      ++pieces_written;
      changed.notify_all();
    }
  }

  bool error_set() {
    std::lock_guard<std::mutex> lock(mutex);
    return !error.empty();
  }

  void write_piece(Piece& piece, torch::Tensor& widened) {
#ifdef MYRIAD_WITH_CUDA
    if (piece.ready) piece.ready->synchronize();
#endif
    const char* base = static_cast<const char*>(buffers[piece.buffer].data_ptr());
    for (const Segment& s : piece.segments) {
      const FileLayout& layout = layouts[s.file];
      const char* data = base + s.buffer_offset;
      int64_t bytes = s.elements * static_cast<int64_t>(c10::elementSize(s.dtype));
      if (hdf5_stored_dtype(s.dtype) != s.dtype && s.dtype != torch::kBool) {
        if (!widened.defined() || widened.numel() < s.elements)
          widened = torch::empty({buffer_bytes / 2}, torch::kFloat32);
        torch::Tensor out = widened.narrow(0, 0, s.elements);
        out.copy_(
            torch::from_blob(const_cast<char*>(data), {s.elements}, torch::TensorOptions(s.dtype)));
        data = static_cast<const char*>(out.data_ptr());
        bytes = s.elements * 4;
      }
      const int64_t at = layout.offsets[s.dataset] + s.stored_offset;
      write_at(layout.fd, data, bytes, at, layout.path);
      // Writeback starts now, beside the other writes, rather than all at the fsync.
      sync_file_range(layout.fd, at, bytes, SYNC_FILE_RANGE_WRITE);
      // Checksummed while in memory: the file is not read back.
      const uint32_t crc = crc32_of(data, bytes);
      {
        std::lock_guard<std::mutex> lock(mutex);
        layouts[s.file].written.push_back({at, bytes, crc});
      }
      if (!wrote_once.exchange(true)) fault_point("write", step);
    }
  }

  void join() {
    for (std::thread& t : workers) t.join();
    workers.clear();
    if (coordinator.joinable()) coordinator.join();
    for (FileLayout& layout : layouts) {
      if (layout.fd >= 0) close(layout.fd);
      layout.fd = -1;
    }
  }
};

SnapshotWriter::SnapshotWriter(torch::Device device, int64_t host_memory_bytes, int threads)
    : impl_(std::make_unique<Impl>(device, host_memory_bytes, threads)) {}

SnapshotWriter::~SnapshotWriter() {
  if (!impl_->in_flight) return;
  impl_->fail("abandoned");
  impl_->join();
#ifdef MYRIAD_WITH_CUDA
  // Copies may still be landing in the buffers about to be freed.
  if (impl_->copy_stream) impl_->copy_stream->synchronize();
#endif
}

int64_t SnapshotWriter::memory_for(const std::vector<SnapshotFile>& files) {
  // Buffers hold one file's data each.
  int64_t bytes = 0;
  for (const SnapshotFile& file : files)
    bytes += round_up(std::max<int64_t>(1, host_bytes(file)), kMaxBufferBytes);
  return std::max(bytes, 2 * kMaxBufferBytes);
}

void SnapshotWriter::reserve(int64_t host_memory_bytes) {
  MYRIAD_CHECK(!impl_->in_flight, "cannot add snapshot buffers while one is written");
  impl_->reserve(host_memory_bytes);
}

int64_t SnapshotWriter::host_memory_bytes() const {
  return static_cast<int64_t>(impl_->buffers.size()) * impl_->buffer_bytes;
}

int64_t SnapshotWriter::buffer_bytes(int64_t host_memory_bytes) {
  if (host_memory_bytes >= 2 * kMaxBufferBytes) return kMaxBufferBytes;
  return std::max(kMinBufferBytes, host_memory_bytes / 2 / kAlign * kAlign);
}

void SnapshotWriter::begin(const std::string& directory, std::vector<SnapshotFile> files,
                           int64_t step) {
  Impl& m = *impl_;
  MYRIAD_CHECK(!m.in_flight, "a snapshot is already being written (step {})", m.step);
  m.in_flight = true;
  m.step = step;
  m.directory = directory;
  m.files = std::move(files);
  m.layouts.assign(m.files.size(), {});
  m.start = Clock::now();
  m.outcome = {};
  m.queue.clear();
  // Every buffer is free between snapshots (one that failed may have left some taken).
  m.free_buffers.clear();
  for (int b = 0; b < static_cast<int>(m.buffers.size()); ++b) m.free_buffers.push_back(b);
  m.pieces_submitted = m.pieces_written = 0;
  m.input_complete = m.layout_ready = m.finished = false;
  m.error.clear();
  m.wrote_once = false;
#ifdef MYRIAD_WITH_CUDA
  m.copies_begin.reset();
  m.forward_copies_done.reset();
  m.copies_done.reset();
  m.forward_ordered = m.backward_ordered = false;
#endif
  m.coordinator = std::thread([&m] { m.coordinate(); });
  for (int t = 0; t < m.threads; ++t) m.workers.emplace_back([&m] { m.write_pieces(); });
  try {
    m.copy_all();
  } catch (const Error& e) {
    m.fail(e.message());
  } catch (const std::exception& e) {
    m.fail(e.what());
  }
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    m.input_complete = true;
    m.changed.notify_all();
  }
}

void SnapshotWriter::order_before_forward() {
#ifdef MYRIAD_WITH_CUDA
  Impl& m = *impl_;
  if (!m.in_flight || m.forward_ordered || m.backward_ordered) return;
  m.forward_ordered = true;
  if (m.forward_copies_done)
    m.forward_copies_done->block(at::cuda::getCurrentCUDAStream(m.device.index()));
#endif
}

void SnapshotWriter::order_before_backward() {
#ifdef MYRIAD_WITH_CUDA
  Impl& m = *impl_;
  if (!m.in_flight || m.backward_ordered) return;
  m.backward_ordered = true;
  if (m.copies_done) m.copies_done->block(at::cuda::getCurrentCUDAStream(m.device.index()));
#endif
}

bool SnapshotWriter::in_flight() const {
  return impl_->in_flight;
}

bool SnapshotWriter::done() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->in_flight && impl_->finished;
}

SnapshotOutcome SnapshotWriter::wait() {
  Impl& m = *impl_;
  MYRIAD_CHECK(m.in_flight, "no snapshot is being written");
  m.join();
  SnapshotOutcome outcome = std::move(m.outcome);
#ifdef MYRIAD_WITH_CUDA
  if (m.copies_done) {
    m.copies_done->synchronize();
    outcome.device_copy_seconds = m.copies_begin->elapsed_time(*m.copies_done) / 1e3;
  }
#endif
  m.in_flight = false;
  outcome.error = m.error;
  m.files.clear();  // releases the tensors it held
  return outcome;
}

}  // namespace myriad
