#include "myriad/ckpt/torch_file.h"

#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <map>

#include "myriad/data/pickle.h"
#include "myriad/util/error.h"

namespace myriad {

void write_torch_state_dict(const StateDict& state, const std::string& path) {
  c10::Dict<std::string, torch::Tensor> tensors;
  for (const auto& [name, tensor] : state) tensors.insert(name, tensor.detach().cpu().contiguous());
  std::string pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickle.append(data, size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(tensors);
  pickler.stop();
  try {
    caffe2::serialize::PyTorchStreamWriter writer(path);
    const std::vector<torch::Tensor>& storages = pickler.tensorData();
    for (size_t i = 0; i < storages.size(); ++i) {
      const auto bytes = torch::jit::getWriteableTensorData(storages[i]);
      writer.writeRecord("data/" + std::to_string(i), bytes.data(), bytes.sizeInBytes());
    }
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
    writer.writeEndOfFile();
  } catch (const c10::Error& e) {
    MYRIAD_THROW("cannot write '{}': {}", path, e.what_without_backtrace());
  }
}

namespace {

// --- the zip archive ---------------------------------------------------------------------------

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kZip64End = 0x06064b50;

struct Entry {
  std::string name;
  uint64_t data = 0;  // offset of the stored bytes
  uint64_t size = 0;  // in the file
  uint32_t crc = 0;
  bool stored = true;  // neither compressed nor encrypted: what torch.save writes
};

// Little-endian fields of a byte range read from the file.
class Fields {
 public:
  Fields(std::string bytes, const std::string& what) : bytes_(std::move(bytes)), what_(what) {}
  uint64_t get(size_t at, int width) const {
    MYRIAD_CHECK(at + static_cast<size_t>(width) <= bytes_.size(),
                 "{} is corrupt: a zip record is cut short", what_);
    uint64_t v = 0;
    for (int i = width - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes_[at + i]);
    return v;
  }
  std::string text(size_t at, size_t n) const {
    MYRIAD_CHECK(at + n <= bytes_.size(), "{} is corrupt: a zip record is cut short", what_);
    return bytes_.substr(at, n);
  }
  size_t size() const { return bytes_.size(); }

 private:
  std::string bytes_;
  const std::string& what_;
};

class File {
 public:
  explicit File(const std::string& path) : path_(path) {
    fd_ = open(path.c_str(), O_RDONLY);
    MYRIAD_CHECK(fd_ >= 0, "cannot open '{}': {}", path, std::strerror(errno));
    struct stat info {};
    if (fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
      close(fd_);
      MYRIAD_THROW("'{}' is not a regular file", path);
    }
    size_ = static_cast<uint64_t>(info.st_size);
  }
  ~File() { close(fd_); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  uint64_t size() const { return size_; }
  // `n` bytes at `at`, which must lie inside the file.
  std::string read(uint64_t at, uint64_t n) const {
    MYRIAD_CHECK(at <= size_ && n <= size_ - at,
                 "'{}' is corrupt: it refers to bytes [{}, +{}) of a file of {}", path_, at, n,
                 size_);
    std::string out(static_cast<size_t>(n), '\0');
    for (uint64_t done = 0; done < n;) {
      const ssize_t got = pread(fd_, out.data() + done, static_cast<size_t>(n - done),
                                static_cast<off_t>(at + done));
      MYRIAD_CHECK(got > 0, "reading '{}': {}", path_,
                   got == 0 ? "unexpected end of file" : std::strerror(errno));
      done += static_cast<uint64_t>(got);
    }
    return out;
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Where the end of central directory record starts in `tail`: the last signature, since a
// comment may follow the record.
size_t find_end_of_directory(const Fields& tail, const std::string& what) {
  for (size_t at = tail.size() - 22 + 1; at-- > 0;) {
    if (tail.get(at, 4) == kEndOfDirectory) return at;
  }
  MYRIAD_THROW("{} is not a zip archive: no end of central directory", what);
}

// The central directory's entry count, size and offset.
struct Directory {
  uint64_t count = 0;
  uint64_t size = 0;
  uint64_t offset = 0;
};

// The directory as the end record states it, or its ZIP64 record where a field overflowed.
Directory locate_directory(const File& file, const std::string& what) {
  MYRIAD_CHECK(file.size() >= 22, "{} is not a torch.save file: {} bytes", what, file.size());
  const uint64_t tail_start = file.size() > 65557 ? file.size() - 65557 : 0;
  const Fields tail(file.read(tail_start, file.size() - tail_start), what);
  const size_t end = find_end_of_directory(tail, what);
  Directory d{tail.get(end + 10, 2), tail.get(end + 12, 4), tail.get(end + 16, 4)};
  if (d.count == 0xFFFF || d.size == 0xFFFFFFFF || d.offset == 0xFFFFFFFF) {
    MYRIAD_CHECK(end >= 20 && tail.get(end - 20, 4) == kZip64Locator,
                 "{} is corrupt: a ZIP64 archive without its locator", what);
    const Fields zip64(file.read(tail.get(end - 20 + 8, 8), 56), what);
    MYRIAD_CHECK(zip64.get(0, 4) == kZip64End, "{} is corrupt: no ZIP64 end of directory", what);
    d = {zip64.get(32, 8), zip64.get(40, 8), zip64.get(48, 8)};
  }
  return d;
}

// ZIP64 sizes and offset, for the fields that overflowed, from the extra fields in
// [begin, end) of the directory.
void read_zip64_extra(const Fields& directory, size_t begin, size_t end, uint64_t& size,
                      uint64_t& compressed, uint64_t& local) {
  for (size_t x = begin; x + 4 <= end;) {
    const uint64_t id = directory.get(x, 2), length = directory.get(x + 2, 2);
    size_t field = x + 4;
    if (id == 0x0001) {
      if (size == 0xFFFFFFFF) {
        size = directory.get(field, 8);
        field += 8;
      }
      if (compressed == 0xFFFFFFFF) {
        compressed = directory.get(field, 8);
        field += 8;
      }
      if (local == 0xFFFFFFFF) local = directory.get(field, 8);
    }
    x += 4 + length;
  }
}

// Where entry `e`'s bytes start: past its local header at `local`, whose name and extra field
// need not match the directory's.
void locate_data(const File& file, uint64_t local, Entry& e, const std::string& what) {
  const Fields header(file.read(local, 30), what);
  MYRIAD_CHECK(header.get(0, 4) == kLocalHeader, "{} is corrupt: entry '{}' has no local header",
               what, e.name);
  e.data = local + 30 + header.get(26, 2) + header.get(28, 2);
  MYRIAD_CHECK(e.data <= file.size() && e.size <= file.size() - e.data,
               "{} is corrupt: entry '{}' runs past the end of the file", what, e.name);
}

// Entry `k` of the directory, whose record starts at byte `at` of it; `at` moves past it.
Entry read_directory_entry(const File& file, const Fields& directory, size_t& at, uint64_t k,
                           const std::string& what) {
  MYRIAD_CHECK(directory.get(at, 4) == kCentralHeader,
               "{} is corrupt: entry {} of its zip directory has no signature", what, k);
  const uint64_t flags = directory.get(at + 8, 2);
  const uint64_t method = directory.get(at + 10, 2);
  Entry e;
  e.crc = static_cast<uint32_t>(directory.get(at + 16, 4));
  uint64_t compressed = directory.get(at + 20, 4);
  e.size = directory.get(at + 24, 4);
  const size_t name_length = directory.get(at + 28, 2);
  const size_t extra_length = directory.get(at + 30, 2);
  const size_t comment_length = directory.get(at + 32, 2);
  uint64_t local = directory.get(at + 42, 4);
  e.name = directory.text(at + 46, name_length);
  const size_t extra = at + 46 + name_length;
  read_zip64_extra(directory, extra, extra + extra_length, e.size, compressed, local);
  e.stored = (flags & 1) == 0 && method == 0 && compressed == e.size;
  e.size = compressed;
  locate_data(file, local, e, what);
  at = extra + extra_length + comment_length;
  return e;
}

// The archive's entries by name. torch.save stores every record uncompressed; compressed or
// encrypted entries are listed, and refused if read (read_entry), never decompressed.
std::map<std::string, Entry> read_directory(const File& file, const std::string& what) {
  const Directory d = locate_directory(file, what);
  // Each entry takes at least 46 bytes of the directory.
  MYRIAD_CHECK(d.count <= d.size / 46 + 1, "{} is corrupt: {} entries in a directory of {}", what,
               d.count, d.size);
  const Fields directory(file.read(d.offset, d.size), what);
  std::map<std::string, Entry> entries;
  size_t at = 0;
  for (uint64_t k = 0; k < d.count; ++k) {
    const Entry e = read_directory_entry(file, directory, at, k, what);
    entries[e.name] = e;
  }
  return entries;
}

// The bytes of a stored entry, checked against its checksum.
std::string read_entry(const File& file, const Entry& entry, const std::string& what) {
  MYRIAD_CHECK(
      entry.stored,
      "{}: entry '{}' is compressed or encrypted; torch.save stores its records as they are", what,
      entry.name);
  const std::string bytes = file.read(entry.data, entry.size);
  const uint32_t crc = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
  MYRIAD_CHECK(crc == entry.crc, "{}: entry '{}' fails its checksum (a corrupt file)", what,
               entry.name);
  return bytes;
}

// --- the pickle ---------------------------------------------------------------------------------

const std::map<std::string, torch::ScalarType>& storage_types() {
  static const std::map<std::string, torch::ScalarType> types = {
      {"FloatStorage", torch::kFloat32}, {"DoubleStorage", torch::kFloat64},
      {"HalfStorage", torch::kFloat16},  {"BFloat16Storage", torch::kBFloat16},
      {"LongStorage", torch::kInt64},    {"IntStorage", torch::kInt32},
      {"ShortStorage", torch::kInt16},   {"CharStorage", torch::kInt8},
      {"ByteStorage", torch::kUInt8},    {"BoolStorage", torch::kBool}};
  return types;
}

bool allowed_global(const std::string& module, const std::string& name) {
  if (module == "collections") return name == "OrderedDict";
  if (module == "torch._utils") return name == "_rebuild_tensor_v2" || name == "_rebuild_parameter";
  return module == "torch" && storage_types().count(name) > 0;
}

using Kind = PickleValue::Kind;

int64_t integer(const PickleValue* v, const std::string& what) {
  MYRIAD_CHECK(v->kind == Kind::kInt, "{}: expected an integer in a tensor, found a {}", what,
               v->kind_name());
  return v->integer;
}

std::vector<int64_t> integers(const PickleValue* v, const std::string& what) {
  MYRIAD_CHECK(v->kind == Kind::kTuple, "{}: expected a tuple of sizes, found a {}", what,
               v->kind_name());
  std::vector<int64_t> out;
  for (const PickleValue* item : v->items) {
    out.push_back(integer(item, what));
    MYRIAD_CHECK(out.back() >= 0, "{}: a negative size or stride", what);
  }
  return out;
}

// The entries of a dict, or of collections.OrderedDict() filled by SETITEMS, as data.
std::vector<std::pair<const PickleValue*, const PickleValue*>> dict_items(const PickleValue& v) {
  std::vector<std::pair<const PickleValue*, const PickleValue*>> items;
  const std::vector<const PickleValue*>* flat = nullptr;
  if (v.kind == Kind::kDict) flat = &v.items;
  if (v.is_call_of("collections.OrderedDict") && v.items.empty()) flat = &v.set_items;
  if (flat == nullptr) return items;
  for (size_t i = 0; i + 1 < flat->size(); i += 2) items.emplace_back((*flat)[i], (*flat)[i + 1]);
  return items;
}

bool is_dict(const PickleValue& v) {
  return v.kind == Kind::kDict || (v.is_call_of("collections.OrderedDict") && v.items.empty());
}

class TensorReader {
 public:
  TensorReader(const File& file, const std::map<std::string, Entry>& entries, std::string prefix,
               const std::string& what)
      : file_(file), entries_(entries), prefix_(std::move(prefix)), what_(what) {}

  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]) or
  // _rebuild_parameter(tensor, requires_grad, hooks).
  torch::Tensor tensor(const PickleValue* v, const std::string& name) {
    const std::string where = what_ + ", tensor '" + name + "'";
    if (v->is_call_of("torch._utils._rebuild_parameter")) {
      MYRIAD_CHECK(!v->items.empty(), "{}: a parameter without its tensor", where);
      return tensor(v->items[0], name);
    }
    MYRIAD_CHECK(v->is_call_of("torch._utils._rebuild_tensor_v2") &&
                     (v->items.size() == 6 || v->items.size() == 7),
                 "{}: not a tensor (a {}); a state dict holds tensors only", where, v->kind_name());
    const torch::Tensor data = storage(v->items[0], where);
    const int64_t offset = integer(v->items[1], where);
    const std::vector<int64_t> size = integers(v->items[2], where);
    const std::vector<int64_t> stride = integers(v->items[3], where);
    MYRIAD_CHECK(size.size() == stride.size(), "{}: {} sizes but {} strides", where, size.size(),
                 stride.size());
    // The last element it reaches must lie inside the storage, without overflow on the way.
    int64_t last = offset, elements = 1;
    bool empty = false;
    for (size_t d = 0; d < size.size(); ++d) {
      if (size[d] == 0) empty = true;
      MYRIAD_CHECK(size[d] <= 1 || elements <= std::numeric_limits<int64_t>::max() / size[d],
                   "{}: sizes overflow", where);
      if (size[d] > 0) elements *= size[d];
      if (size[d] > 1) {
        MYRIAD_CHECK(stride[d] <= (std::numeric_limits<int64_t>::max() - last) / (size[d] - 1),
                     "{}: sizes and strides overflow", where);
        last += (size[d] - 1) * stride[d];
      }
    }
    MYRIAD_CHECK(offset >= 0 && (empty || last < data.numel()),
                 "{}: reaches element {} of a storage of {}", where, last, data.numel());
    if (empty) return torch::empty(size, data.options());
    return data.as_strided(size, stride, offset).contiguous();
  }

 private:
  // ('storage', torch.XStorage, key, location, numel): the record data/KEY, read once.
  torch::Tensor storage(const PickleValue* v, const std::string& where) {
    MYRIAD_CHECK(v->kind == Kind::kPersistentId && v->items[0]->kind == Kind::kTuple &&
                     v->items[0]->items.size() == 5,
                 "{}: its storage is not a persistent id of 5 fields", where);
    const std::vector<const PickleValue*>& id = v->items[0]->items;
    MYRIAD_CHECK(id[0]->kind == Kind::kString && id[0]->bytes == "storage" &&
                     id[1]->kind == Kind::kGlobal && id[2]->kind == Kind::kString,
                 "{}: a persistent id that is not a storage", where);
    const std::string& global = id[1]->bytes;
    const auto type = global.rfind("torch.", 0) == 0 ? storage_types().find(global.substr(6))
                                                     : storage_types().end();
    MYRIAD_CHECK(type != storage_types().end(), "{}: {} is not a storage type", where, global);
    const torch::ScalarType dtype = type->second;
    const int64_t numel = integer(id[4], where);
    const std::string key = id[2]->bytes;
    const auto cached = storages_.find(key);
    if (cached != storages_.end()) {
      MYRIAD_CHECK(cached->second.scalar_type() == dtype && cached->second.numel() == numel,
                   "{}: storage {} is read as two types", where, key);
      return cached->second;
    }
    const auto entry = entries_.find(prefix_ + "data/" + key);
    MYRIAD_CHECK(entry != entries_.end(), "{}: the archive has no record data/{}", where, key);
    const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
    MYRIAD_CHECK(numel >= 0 && static_cast<uint64_t>(numel) * element == entry->second.size,
                 "{}: storage {} of {} elements of {} bytes has a record of {} bytes", where, key,
                 numel, element, entry->second.size);
    const std::string bytes = read_entry(file_, entry->second, what_);
    torch::Tensor t = torch::empty({numel}, torch::dtype(dtype));
    if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    storages_[key] = t;
    return t;
  }

  const File& file_;
  const std::map<std::string, Entry>& entries_;
  std::string prefix_;
  const std::string& what_;
  std::map<std::string, torch::Tensor> storages_;
};

}  // namespace

StateDict read_torch_state_dict(const std::string& path) {
  const std::string what = "'" + path + "'";
  const File file(path);
  const std::string magic = file.read(0, std::min<uint64_t>(4, file.size()));
  MYRIAD_CHECK(magic == "PK\x03\x04",
               "{} is not a zip-format torch.save file: the legacy format (before PyTorch 1.6, or "
               "_use_new_zipfile_serialization=False) is not read; save it again with a newer "
               "PyTorch",
               what);
  const std::map<std::string, Entry> entries = read_directory(file, what);
  // Records live under one directory whose name torch.save chose (the file's stem).
  std::string prefix;
  const Entry* pickle_entry = nullptr;
  for (const auto& [name, entry] : entries) {
    const size_t slash = name.find('/');
    if (slash != std::string::npos && name.substr(slash) == "/data.pkl") {
      prefix = name.substr(0, slash + 1);
      pickle_entry = &entry;
    }
  }
  MYRIAD_CHECK(pickle_entry != nullptr,
               "{} is a zip archive without data.pkl, not a torch.save file", what);
  MYRIAD_CHECK(entries.count(prefix + "constants.pkl") == 0,
               "{} is a TorchScript archive (torch.jit.save), not a state dict: save the module's "
               "state_dict() with torch.save",
               what);
  if (const auto order = entries.find(prefix + "byteorder"); order != entries.end()) {
    MYRIAD_CHECK(read_entry(file, order->second, what) == "little",
                 "{} was written on a big-endian machine", what);
  }
  const Pickle pickle =
      unpickle(read_entry(file, *pickle_entry, what), what + " (data.pkl)", allowed_global);
  const PickleValue* dict = &pickle.root();
  MYRIAD_CHECK(is_dict(*dict), "{} holds a {}, not a state dict", what, dict->kind_name());
  // An arcface_torch training checkpoint holds the backbone's state dict under this key.
  if (const PickleValue* nested = dict->find("state_dict_backbone"); nested != nullptr) {
    MYRIAD_CHECK(is_dict(*nested), "{}: state_dict_backbone is a {}, not a dict", what,
                 nested->kind_name());
    dict = nested;
  }
  TensorReader reader(file, entries, prefix, what);
  StateDict state;
  for (const auto& [key, value] : dict_items(*dict)) {
    MYRIAD_CHECK(key->kind == Kind::kString, "{}: a key that is a {}, not a name", what,
                 key->kind_name());
    std::string name = key->bytes;
    if (name.rfind("module.", 0) == 0) name = name.substr(7);
    state.emplace_back(name, reader.tensor(value, name));
  }
  MYRIAD_CHECK(!state.empty(), "{} holds an empty state dict", what);
  return state;
}

}  // namespace myriad
