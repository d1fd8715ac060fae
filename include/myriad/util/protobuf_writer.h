#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace myriad {

// A Protocol Buffers message in the wire format (protobuf.dev, "Encoding"), written by hand so that
// the ONNX export builds where no protobuf library is installed (docs/insightface.md,
// "Deploying"). Fields are appended in the order of the calls; a field number is the .proto file's.
// Integers are varints (negative ones in ten bytes, as protobuf writes int64), floats are
// little-endian fixed32, strings, bytes and sub-messages are length-delimited.
class ProtoMessage {
 public:
  void add_int(int field, int64_t value);
  void add_float(int field, float value);
  void add_bytes(int field, std::string_view bytes);
  void add_message(int field, const ProtoMessage& message) { add_bytes(field, message.bytes()); }
  // A repeated int64 field, packed (one length-delimited run of varints), as proto3 writes it.
  void add_packed_ints(int field, const std::vector<int64_t>& values);
  // The key and length of a length-delimited field of `size` bytes that the caller writes right
  // after these, so that a large payload need not be copied into the message.
  void add_length_prefix(int field, uint64_t size);

  const std::string& bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }

  // Bytes of the varint encoding of `value`, and of a length-delimited field's key and length.
  static size_t varint_size(uint64_t value);
  static size_t length_prefix_size(int field, uint64_t size);

 private:
  void add_varint(uint64_t value);
  void add_key(int field, int wire_type);

  std::string bytes_;
};

}  // namespace myriad
