#pragma once

#include <cstddef>
#include <cstdint>

namespace myriad {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord files use it.
uint32_t crc32c(const void* data, size_t size);

// TFRecord's masked form: the CRC rotated right by 15 bits plus 0xa282ead8, so that a CRC stored
// inside checksummed data does not checksum to a constant.
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace myriad
