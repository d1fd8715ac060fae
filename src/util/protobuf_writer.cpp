#include "myriad/util/protobuf_writer.h"

#include <cstring>

namespace myriad {

namespace {

// Wire types of the encoding.
constexpr int kVarint = 0;
constexpr int kFixed32 = 5;
constexpr int kLengthDelimited = 2;

}  // namespace

size_t ProtoMessage::varint_size(uint64_t value) {
  size_t n = 1;
  for (; value >= 0x80; value >>= 7) ++n;
  return n;
}

size_t ProtoMessage::length_prefix_size(int field, uint64_t size) {
  return varint_size(static_cast<uint64_t>(field) << 3) + varint_size(size);
}

void ProtoMessage::add_varint(uint64_t value) {
  for (; value >= 0x80; value >>= 7) bytes_.push_back(static_cast<char>((value & 0x7f) | 0x80));
  bytes_.push_back(static_cast<char>(value));
}

void ProtoMessage::add_key(int field, int wire_type) {
  add_varint(static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}

void ProtoMessage::add_int(int field, int64_t value) {
  add_key(field, kVarint);
  add_varint(static_cast<uint64_t>(value));
}

void ProtoMessage::add_float(int field, float value) {
  add_key(field, kFixed32);
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<char>(bits >> (8 * i)));
}

void ProtoMessage::add_bytes(int field, std::string_view bytes) {
  add_length_prefix(field, bytes.size());
  bytes_.append(bytes);
}

void ProtoMessage::add_packed_ints(int field, const std::vector<int64_t>& values) {
  size_t size = 0;
  for (int64_t v : values) size += varint_size(static_cast<uint64_t>(v));
  add_length_prefix(field, size);
  for (int64_t v : values) add_varint(static_cast<uint64_t>(v));
}

void ProtoMessage::add_length_prefix(int field, uint64_t size) {
  add_key(field, kLengthDelimited);
  add_varint(size);
}

}  // namespace myriad
